"""Issue 18 item 2: status and warmup count what is on disk, not what the cache's index says.

Cache files deleted or truncated behind the cache's back (a cleaner, a full disk, a hand) made
``datacache get datasets`` and ``ls -l`` say 100 % and a resumable warmup report Complete with
0 B loaded (the report pattern of JuiceFS #6513 and Fluid #633). Now a block counts only when its
file version's cache file is there and reaches the block's end; warmup reloads exactly what is gone, and ``warmup --check`` also what
fails its checksum.
"""

from __future__ import annotations

import json
import os

import pytest

from datacache.api.quantity import format_bytes
from datacache.cache.blocks import block_count, block_range
from datacache.control.embedded import Embedded
from datacache.control.reconcile import percentage
from support import dataset_yaml
from test_cli import dc

BLOCK = 64 << 10
SIZES = {"a.bin": 10 * BLOCK, "b.bin": 10 * BLOCK - 1000, "sub/c.bin": 9 * BLOCK + 1}  # 30 blocks


@pytest.fixture
def warmed(datacache_home, tmp_path):
    """A local dataset of 30 blocks, warmed up through the CLI: ``{path: bytes}``."""
    src = tmp_path / "src"
    files = {}
    for path, size in SIZES.items():
        (src / os.path.dirname(path)).mkdir(parents=True, exist_ok=True)
        files[path] = os.urandom(size)
        (src / path).write_bytes(files[path])
    (tmp_path / "ds.yaml").write_text(dataset_yaml("truth", [{"name": "local", "mountPoint": str(src)}],
                                                   [{"mediumtype": "SSD", "path": "cache", "quota": "64Mi"}],
                                                   block_size="64Ki"))
    dc("apply", "-f", str(tmp_path / "ds.yaml"), home=datacache_home, check=True)
    out = dc("warmup", "-q", "truth", home=datacache_home, check=True).stdout.decode()
    assert f"{format_bytes(sum(SIZES.values()))} loaded from the UFS" in out
    assert sum(block_count(s, BLOCK) for s in SIZES.values()) == 30
    return files


def _block_files(home) -> dict[tuple[str, int], tuple[str, int, int]]:
    """``(dataset path, index) -> (cache file, block offset in it, block length)`` of every cached
    block."""
    client = Embedded(str(home)).open_dataset("truth")
    try:
        found = {}
        for entry in client.manifest:
            for i in range(block_count(entry.size, BLOCK)):
                path = client.source.store.block_file(str(client.source.key(entry, i)))
                start, end = block_range(i, entry.size, BLOCK)
                found[(entry.path, i)] = (path, start, end - start)
        return found
    finally:
        client.close()


def _status(home) -> dict:
    return json.loads(dc("get", "dataset", "truth", "-o", "json", home=home, check=True).stdout)["status"]


def _ls(home) -> dict[str, str]:
    lines = dc("ls", "-l", "truth", home=home, check=True).stdout.decode().splitlines()
    lines += dc("ls", "-l", "truth/sub", home=home, check=True).stdout.decode().splitlines()
    return {line.split()[-1]: line.split()[1] for line in lines if not line.split()[-1].endswith("/")}


def test_deleted_and_truncated_cache_files_are_not_counted_and_warmup_reloads_them(warmed, datacache_home):
    blocks = _block_files(datacache_home)
    assert all(path is not None for path, _, _ in blocks.values())
    os.unlink(blocks[("a.bin", 0)][0])  # the whole version's file
    os.truncate(blocks[("b.bin", 3)][0], blocks[("b.bin", 3)][1] + 5)  # cut inside block 3
    os.truncate(blocks[("sub/c.bin", 9)][0], blocks[("sub/c.bin", 9)][1])  # the last block, 1 byte: gone
    gone = [("a.bin", i) for i in range(10)] + [("b.bin", i) for i in range(3, 10)] + [("sub/c.bin", 9)]
    lost = sum(blocks[k][2] for k in gone)
    total = sum(SIZES.values())

    status = _status(datacache_home)
    assert status["cacheStates"]["cached"] == format_bytes(total - lost)
    assert status["cacheStates"]["cachedPercentage"] == percentage(total - lost, total)
    table = dc("get", "datasets", home=datacache_home, check=True).stdout.decode().splitlines()
    assert table[1].split()[2] == format_bytes(total - lost)
    lost_of = {f: sum(blocks[key][2] for key in gone if key[0] == f) for f in SIZES}
    assert _ls(datacache_home) == {f.rsplit("/", 1)[-1]: percentage(size - lost_of[f], size) for f, size in SIZES.items()}

    out = dc("warmup", "-q", "truth", home=datacache_home, check=True).stdout.decode()
    assert "Complete in" in out and f"{format_bytes(lost)} loaded from the UFS" in out
    status = _status(datacache_home)
    assert status["cacheStates"]["cached"] == format_bytes(total)
    assert status["cacheStates"]["cachedPercentage"] == "100.0%"
    assert _ls(datacache_home) == {"a.bin": "100.0%", "b.bin": "100.0%", "c.bin": "100.0%"}
    for path, data in warmed.items():
        assert dc("cat", f"truth/{path}", home=datacache_home, check=True).stdout == data


def test_warmup_check_reloads_a_block_whose_bytes_changed_at_its_size(warmed, datacache_home):
    blocks = _block_files(datacache_home)
    path, offset, length = blocks[("b.bin", 5)]
    with open(path, "r+b") as f:  # same size, other bytes: only the checksum tells
        f.seek(offset)
        f.write(b"\0" * 100)
    out = dc("warmup", "-q", "truth", home=datacache_home, check=True).stdout.decode()
    assert "Complete in" in out and "0B loaded from the UFS" in out  # presence and size only
    out = dc("warmup", "-q", "--check", "truth", home=datacache_home, check=True).stdout.decode()
    assert "Complete in" in out and f"{format_bytes(length)} loaded from the UFS" in out
    assert _status(datacache_home)["cacheStates"]["cachedPercentage"] == "100.0%"
    assert dc("cat", "truth/b.bin", home=datacache_home, check=True).stdout == warmed["b.bin"]
