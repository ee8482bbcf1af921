"""Bounded soak: 16 concurrent readers — 8 through a FUSE mount, 8 through ``datacache://`` — over a
runtime of 3 worker processes holding a dataset larger than their SSD quotas together, for
``DATACACHE_SOAK_S`` seconds (default 30; set it higher for a long run); a worker is killed with
SIGKILL a third of the way in and restarted by its supervisor. Zero wrong bytes (sha256 of every
read against the source), zero hung reads, each worker's cache under its quota at every sample,
the restarted worker keeps the blocks the kill left on its disk (any missing one is accounted
for by its evictions), the FUSE daemon's RSS flat after warm-up. Prints reads, bytes checked,
p50/p99 latency and peak RSS."""

from __future__ import annotations

import os
import random
import signal
import statistics
import sys
import threading
import time
import urllib.request

import fsspec
import pytest

from cluster_faults import apply_cluster, disk_keys, live, reap, wait_restarted, worker_dirs
from datacache.cluster.metrics import parse
from fault_support import sha
from support import du

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fuse"))
from fuse_support import HAVE_FUSE, SKIP_REASON, daemon_pid, force_cleanup, mount  # noqa: E402

pytestmark = pytest.mark.skipif(not HAVE_FUSE, reason=SKIP_REASON)

DURATION_S = float(os.environ.get("DATACACHE_SOAK_S", "30"))
QUOTA = 16 << 20  # per worker
WORKERS = 3
BLOCK = 256 << 10
HUNG_S = 30.0  # a read slower than this counts as hung
RSS_GROWTH = 48 << 20  # bytes the daemon may grow after warm-up (allocator noise, not a leak)


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _kill_and_check_restart(home: str, worker: str) -> tuple[int, int, int]:
    """SIGKILL ``worker`` (readers running), wait for its restart; every block the kill left on its
    disk is still there, or was evicted since by the restarted worker (its evictions counter).
    Returns ``(blocks kept, blocks left by the kill, evictions since)``."""
    old = live(home, "soak")[worker]
    os.kill(old.pid, signal.SIGKILL)
    path = worker_dirs(home, "soak")[worker]
    left = disk_keys(path)  # the dead worker's directory, as the kill left it
    new = wait_restarted(home, "soak", old, timeout=HUNG_S)
    now = disk_keys(path)
    with urllib.request.urlopen(new.url + "/metrics", timeout=5) as resp:  # read after the keys
        evicted = int(parse(resp.read().decode())["datacache_worker_evictions_total"])
    assert len(left - now) <= evicted, f"{worker} lost {len(left - now)} blocks with {evicted} evictions"
    return len(left & now), len(left), evicted


def test_soak_fuse_and_fsspec_readers(datacache_home, tmp_path):
    rng = random.Random(1)
    src = tmp_path / "src"
    src.mkdir()
    files = {f"s{i:02d}.bin": rng.randbytes(rng.randrange(256 << 10, 2 << 20)) for i in range(48)}
    for name, data in files.items():
        (src / name).write_bytes(data)
    assert sum(map(len, files.values())) > WORKERS * QUOTA
    home = str(datacache_home)
    apply_cluster(home, "soak", [{"name": "local", "mountPoint": str(src)}],
                  [{"mediumtype": "SSD", "path": "cache", "quota": "16Mi", "high": "0.9", "low": "0.7"}],
                  replicas=WORKERS, block_size="256Ki").close()
    mp = str(tmp_path / "mnt")
    os.makedirs(mp)

    class Env:
        name = "soak"

    Env.home = home
    latencies: list[float] = []
    errors: list[str] = []
    checked = [0]
    lock = threading.Lock()
    stop = threading.Event()
    names = sorted(files)
    fs = fsspec.filesystem("datacache", skip_instance_cache=True)
    try:
        mount(Env, mp)
        pid = daemon_pid(home, mp)

        def reader(seed: int, via_fuse: bool) -> None:
            r = random.Random(seed)
            while not stop.is_set():
                name = r.choice(names)
                data = files[name]
                off = r.randrange(len(data))
                size = r.choice([4096, 65536, BLOCK + 7, 1 << 20, len(data)])
                t0 = time.monotonic()
                try:
                    if via_fuse:
                        fd = os.open(os.path.join(mp, name), os.O_RDONLY)
                        try:
                            got = os.pread(fd, size, off)
                        finally:
                            os.close(fd)
                    else:
                        got = fs.cat_file(f"datacache://soak/{name}", start=off, end=off + size)
                except Exception as err:  # counted as a failure below
                    with lock:
                        errors.append(f"{name}@{off}+{size} ({'fuse' if via_fuse else 'fsspec'}): {err!r}")
                    continue
                took = time.monotonic() - t0
                ok = sha(got) == sha(data[off:off + size])
                with lock:
                    latencies.append(took)
                    checked[0] += len(got)
                    if not ok:
                        errors.append(f"{name}@{off}+{size}: wrong bytes")

        threads = [threading.Thread(target=reader, args=(i, i < 8), daemon=True) for i in range(16)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        rss: list[tuple[float, int]] = []
        peak_du, killed = 0, None
        while time.monotonic() - t0 < DURATION_S:
            time.sleep(0.5)
            rss.append((time.monotonic() - t0, _rss(pid)))
            for path in worker_dirs(home, "soak").values():
                used = du(path)
                peak_du = max(peak_du, used)
                assert used <= QUOTA + BLOCK, f"{path}: cache use {used} over the quota {QUOTA}"
            if killed is None and time.monotonic() - t0 > DURATION_S / 3:
                killed = _kill_and_check_restart(home, "worker-1")
        assert killed is not None
        stop.set()
        for t in threads:
            t.join(HUNG_S)
        assert not any(t.is_alive() for t in threads), "a reader hung"
    finally:
        stop.set()
        force_cleanup(home, mp)
        fs.clear_instance_cache()
        leftovers = reap(home)
    assert not leftovers, f"processes left running: {leftovers}"
    assert not errors, errors[:5]
    lat = sorted(latencies)
    p50, p99 = statistics.median(lat), lat[int(len(lat) * 0.99)]
    after_warmup = [v for t, v in rss if t > DURATION_S / 3]
    peak = max(v for _, v in rss)
    print(f"\nsoak {DURATION_S:.0f} s: {len(lat)} reads, {checked[0] / 2**20:.0f} MiB checked, "
          f"p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms, max {lat[-1] * 1e3:.0f} ms, "
          f"daemon peak RSS {peak / 2**20:.0f} MiB, worker cache peak {peak_du / 2**20:.1f} MiB of {QUOTA >> 20} MiB, "
          f"worker-1 killed and back with {killed[0]} of its {killed[1]} blocks ({killed[2]} evicted since)")
    assert lat[-1] < HUNG_S
    assert max(after_warmup) - min(after_warmup) <= RSS_GROWTH, f"daemon RSS grew: {after_warmup[0]} -> {max(after_warmup)}"
    assert len(lat) > 100
