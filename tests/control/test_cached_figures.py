"""What each CACHED figure counts (issue 19, item 7), checked through the CLI against the block
files really stored: a Dataset's ``cached`` is its current versions' blocks, ``oldVersionsCached``
the blocks of versions a sync replaced or deleted (held until evicted), and a runtime's ``cached``
all it holds on disk, blocks of every version plus the index (an SQLite database and its WAL)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from datacache.api.quantity import format_bytes
from datacache.cache.disk import FILES, INDEX
from support import dataset_yaml

UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def datacache(home, *args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "datacache", *args], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "DATACACHE_HOME": str(home)})
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def status(home, kind: str) -> dict:
    return json.loads(datacache(home, "get", kind, "figs", "-o", "json").stdout)["status"]


def parsed(text: str) -> tuple[float, float]:
    """The byte range a ``format_bytes`` text stands for (two decimals: +-0.005 of its unit)."""
    value, unit = re.fullmatch(r"([\d.]+)(B|KiB|MiB|GiB)", text).groups()
    half = 0.0 if unit == "B" else 0.005 * UNITS[unit]
    return float(value) * UNITS[unit] - half, float(value) * UNITS[unit] + half


def stored_blocks(cache_dir) -> int:
    """Bytes the cache files (one per file version, sparse) hold on disk under the cache directory."""
    files = os.path.join(cache_dir, FILES)
    if not os.path.isdir(files):
        return 0
    stats = [os.stat(os.path.join(files, f)) for f in os.listdir(files)]
    return sum(min(st.st_size, st.st_blocks * 512) for st in stats)


def test_dataset_cached_old_versions_and_runtime_cached_match_the_block_files(tmp_path, datacache_home):
    src = tmp_path / "src"
    src.mkdir()
    old_a, b, new_a = os.urandom(3 * (1 << 20) + 5), os.urandom(100_000), os.urandom(2 * (1 << 20) + 7)
    (src / "a.bin").write_bytes(old_a)
    (src / "b.bin").write_bytes(b)
    spec = tmp_path / "figs.yaml"
    spec.write_text(dataset_yaml("figs", [{"name": "local", "mountPoint": str(src)}],
                                 [{"mediumtype": "SSD", "path": "cache", "quota": "64Mi"}], block_size="1Mi"))
    datacache(datacache_home, "apply", "-f", str(spec))
    cache_dir = datacache_home / "cache" / "default" / "figs"

    # Nothing cached: the runtime's figure is its index alone.
    lo, hi = parsed(status(datacache_home, "cacheruntimes")["cached"])
    assert stored_blocks(cache_dir) == 0 and 0 < lo and hi < 1 << 20
    states = status(datacache_home, "datasets")["cacheStates"]
    assert (states["cached"], states["oldVersionsCached"]) == ("0B", "0B")

    datacache(datacache_home, "warmup", "-q", "figs")
    (src / "a.bin").write_bytes(new_a)  # another version, of another length
    assert datacache(datacache_home, "sync", "figs").stdout.strip() == \
        "dataset.datacache.io/figs synced: 0 added, 1 changed, 0 deleted"
    datacache(datacache_home, "warmup", "-q", "figs")

    states = status(datacache_home, "datasets")["cacheStates"]
    assert states["cached"] == format_bytes(len(new_a) + len(b))
    assert states["oldVersionsCached"] == format_bytes(len(old_a))
    assert stored_blocks(cache_dir) == len(new_a) + len(b) + len(old_a)  # the two figures cover every block

    # A file deleted in the UFS: its blocks move from one figure to the other.
    os.unlink(src / "b.bin")
    datacache(datacache_home, "sync", "figs")
    states = status(datacache_home, "datasets")["cacheStates"]
    assert (states["cached"], states["oldVersionsCached"]) == (format_bytes(len(new_a)),
                                                               format_bytes(len(old_a) + len(b)))

    # The runtime counts every block it holds, plus its index (under 1 MiB here).
    blocks = stored_blocks(cache_dir)
    lo, hi = parsed(status(datacache_home, "cacheruntimes")["cached"])
    assert blocks + os.path.getsize(cache_dir / INDEX) <= hi and lo - blocks < 1 << 20
