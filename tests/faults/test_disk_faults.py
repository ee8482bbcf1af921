"""Cache disk trouble: watermark eviction, a device smaller than the quota that fills up, a
corrupted block file, a cache directory that turns read-only. Reads stay right (sha256) throughout."""

from __future__ import annotations

import os
import shutil
import subprocess
from types import SimpleNamespace

import pytest

from datacache.cache import disk as disk_module
from datacache.cache.disk import DiskTier
from datacache.cluster.metrics import WorkerMetrics, parse
from datacache.cluster.store import ServingDiskTier
from fault_support import apply_dataset, read_all, sha

BLOCK = 256 << 10
HAVE_MOUNT = os.geteuid() == 0 and shutil.which("mount") is not None


@pytest.fixture
def tmpfs(tmp_path):
    """``make(size) -> path``: a tmpfs of ``size`` (e.g. "3m") mounted under tmp_path, unmounted after."""
    if not HAVE_MOUNT:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    made = []

    def make(size: str) -> str:
        path = str(tmp_path / f"tmpfs-{len(made)}")
        os.makedirs(path)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", path], check=True)
        made.append(path)
        return path

    yield make
    for path in made:
        subprocess.run(["umount", "-l", path], check=False)


@pytest.fixture
def local_ufs(tmp_path):
    """A local directory of 24 files of 1 MiB (4 blocks each): ``(path, {name: bytes})``."""
    root = tmp_path / "ufs"
    root.mkdir()
    files = {f"f{i:02d}.bin": os.urandom(1 << 20) for i in range(24)}
    for name, data in files.items():
        (root / name).write_bytes(data)
    return str(root), files


def _open(home, ufs, cache_path: str, quota: str):
    plane = apply_dataset(home, "disk", [{"name": "local", "mountPoint": ufs}],
                          [{"mediumtype": "SSD", "path": cache_path, "quota": quota, "high": "0.9", "low": "0.6"}],
                          block_size="256Ki")
    return plane, plane.open_dataset("disk")


def _disk(client) -> DiskTier:
    return next(lv for lv in client.source.store.levels if isinstance(lv, DiskTier))


def test_eviction_stops_at_low_watermark(tmp_path):
    """Regression: diskcache's cull deleted 10 blocks per round, far below the low watermark."""
    quota, high, low = 8 << 20, 0.9, 0.6
    tier = DiskTier(str(tmp_path / "ssd"), quota, high, low)
    seen = 0
    for i in range(200):
        assert tier.put(f"ds/{i:032x}/0", os.urandom(BLOCK))
        used = tier.used()
        assert used <= quota * high, f"put {i}: {used} bytes over the high watermark"
        if tier.evictions != seen:
            seen = tier.evictions
            # evicted to low - one block, then the block written: low, give or take the index's
            # write-ahead log (checkpointed at its own pace, 64 KiB slack)
            assert quota * low - BLOCK - (64 << 10) <= used <= quota * high, f"after eviction {used} bytes"
    assert seen > 0
    # LRU: the block read last before the round of evictions survives it.
    keep = f"ds/{199:032x}/0"
    assert tier.get(keep) is not None
    for i in range(200, 230):
        tier.put(f"ds/{i:032x}/0", os.urandom(BLOCK))
        tier.get(keep)
    assert keep in tier
    tier.close()


def test_device_smaller_than_quota_fills_up(datacache_home, tmpfs, local_ufs):
    ufs, files = local_ufs
    dev = tmpfs("3m")  # 24 MiB of data, a 64 MiB quota, a 3 MiB device
    plane, client = _open(datacache_home, ufs, dev, "64Mi")
    try:
        for _ in range(2):
            for name, data in files.items():
                assert sha(read_all(client, name)) == sha(data)
        disk = _disk(client)
        assert disk.full_bypasses > 0  # the device did fill
        assert disk.healthy
        assert client.cached_bytes() > 0  # it still caches what fits
    finally:
        client.close()
        plane.close()


def test_corrupt_block_is_dropped_refetched_and_counted(datacache_home, local_ufs, tmp_path):
    ufs, files = local_ufs
    plane, client = _open(datacache_home, ufs, str(tmp_path / "ssd"), "1Gi")
    try:
        name = "f03.bin"
        assert sha(read_all(client, name)) == sha(files[name])
        entry = client.stat(name)
        disk = _disk(client)
        key = str(client.source.key(entry, 1))
        path = disk.block_file(key)
        with open(path, "r+b") as f:  # flip bytes in the middle of block 1, same length
            f.seek(1000)
            f.write(bytes(b ^ 0xFF for b in f.read(16)))
            f.seek(1000)
        before = client.source.ufs_bytes
        assert sha(read_all(client, name)) == sha(files[name])
        assert disk.corrupt == 1
        assert client.source.ufs_bytes - before == BLOCK  # that block, and only it, came again
        assert disk.get(key) is not None and bytes(disk.get(key)) == files[name][BLOCK:2 * BLOCK]
        # A worker over this store reports it on /metrics.
        page = WorkerMetrics(SimpleNamespace(store=client.source.store, source=client.source, peer_bytes=0))
        values = parse(page.render().decode())
        assert values["datacache_worker_corrupt_blocks_total"] == 1
        assert values["datacache_worker_disk_healthy"] == 1
    finally:
        client.close()
        plane.close()


def test_read_only_cache_dir_marks_tier_unhealthy_and_reads_from_ufs(datacache_home, local_ufs, tmp_path,
                                                                       monkeypatch):
    if not HAVE_MOUNT:
        pytest.skip("a read-only bind mount needs root and mount(8)")
    ufs, files = local_ufs
    plane, client = _open(datacache_home, ufs, str(tmp_path / "ssd"), "32Mi")
    disk = _disk(client)
    try:
        assert sha(read_all(client, "f00.bin")) == sha(files["f00.bin"])
        # The directory turns read-only under the running tier (a read-only bind mount over it:
        # a remount would be refused while the index is open for writing).
        subprocess.run(["mount", "--bind", disk.path, disk.path], check=True)
        subprocess.run(["mount", "-o", "remount,bind,ro", disk.path], check=True)
        for name in ("f00.bin", "f01.bin", "f02.bin"):
            assert sha(read_all(client, name)) == sha(files[name])
        assert not disk.healthy and disk.write_errors >= 1
        assert client.source.is_cached(client.stat("f00.bin"), 0)  # what was cached stays
        assert not client.source.is_cached(client.stat("f01.bin"), 0)
        # Writable again: after the recheck delay (0 here) the next fill is cached, tier healthy.
        subprocess.run(["umount", "-l", disk.path], check=True)
        monkeypatch.setattr(disk_module, "RECHECK_S", 0.0)
        assert sha(read_all(client, "f03.bin")) == sha(files["f03.bin"])
        assert disk.healthy and client.source.is_cached(client.stat("f03.bin"), 0)
    finally:
        subprocess.run(["umount", "-l", disk.path], check=False)
        client.close()
        plane.close()


def test_cache_dir_unwritable_at_start_opens_unhealthy_and_reads_from_ufs(datacache_home, local_ufs, tmp_path,
                                                                          monkeypatch, caplog):
    if not HAVE_MOUNT:
        pytest.skip("a read-only bind mount needs root and mount(8)")
    ufs, files = local_ufs
    ssd = tmp_path / "ssd"
    ssd.mkdir()
    subprocess.run(["mount", "--bind", str(ssd), str(ssd)], check=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", str(ssd)], check=True)
    try:
        plane, client = _open(datacache_home, ufs, str(ssd), "32Mi")  # opens: a slower read, no error
        try:
            disk = _disk(client)
            assert not disk.healthy
            warning = next(r.getMessage() for r in caplog.records if "cannot be used" in r.getMessage())
            assert f"fix: remount the file system of {disk.path} read-write" in warning
            assert "tieredstore.levels[].path" in warning
            for _ in range(2):  # every read right, every read from the UFS, nothing cached
                for name in ("f00.bin", "f01.bin"):
                    before = client.source.ufs_bytes
                    assert sha(read_all(client, name)) == sha(files[name])
                    assert client.source.ufs_bytes - before >= len(files[name])  # (read-ahead: more)
            assert client.cached_bytes() == 0 and list(disk.keys()) == []
            # Made writable: after the recheck delay (0 here) the directory is opened and fills cache.
            subprocess.run(["umount", "-l", str(ssd)], check=True)
            monkeypatch.setattr(disk_module, "RECHECK_S", 0.0)
            assert sha(read_all(client, "f02.bin")) == sha(files["f02.bin"])
            assert disk.healthy and client.source.is_cached(client.stat("f02.bin"), 0)
            assert bytes(disk.get(str(client.source.key(client.stat("f02.bin"), 0)))) == files["f02.bin"][:BLOCK]
        finally:
            client.close()
            plane.close()
    finally:
        subprocess.run(["umount", "-l", str(ssd)], check=False)


def test_worker_disk_tier_on_unwritable_dir_serves_nothing(tmp_path):
    """A worker's tier whose directory cannot be made (a file in the way) holds and hands out nothing."""
    (tmp_path / "not-a-dir").write_bytes(b"x")
    tier = ServingDiskTier(str(tmp_path / "not-a-dir" / "worker-0"), 1 << 20)
    assert not tier.healthy and tier.used() == 0
    assert tier.open_block("ds/0/0") is None and tier.get("ds/0/0") is None
    assert not tier.put("ds/0/0", b"block") and "ds/0/0" not in tier
    tier.discard("ds/0/0")
    tier.close()
