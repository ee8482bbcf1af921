"""Cases C1 and C2: the SSD tier never passes its quota, during warmup and concurrent fills."""

from __future__ import annotations

import contextlib
import os
import threading

from datacache.warmup import warmup
from support import apply_dataset, du

MiB = 1 << 20
QUOTA = 64 * MiB
BLOCK = 4 * MiB
LEVELS = [{"mediumtype": "SSD", "path": "cache", "quota": "64Mi", "high": 0.95, "low": 0.80}]


def _make_files(root, n, size):
    os.makedirs(root, exist_ok=True)
    for i in range(n):
        with open(os.path.join(root, f"f{i:03d}.bin"), "wb") as f:
            f.write(os.urandom(size))


class DuSampler(threading.Thread):
    """Samples the bytes under a directory until stopped; ``peak`` is the largest sample."""

    def __init__(self, path):
        super().__init__(daemon=True)
        self.path, self.peak, self.samples = path, 0, 0
        self._stop_evt = threading.Event()

    def run(self):
        while not self._stop_evt.is_set():
            self.peak = max(self.peak, du(self.path))
            self.samples += 1

    def stop(self):
        self._stop_evt.set()
        self.join()
        self.peak = max(self.peak, du(self.path))


def test_c1_warmup_larger_than_quota_stays_under_quota_and_reports(datacache_home, tmp_path):
    src = tmp_path / "src"
    _make_files(src, 64, 4 * MiB)  # 256 MiB
    plane = apply_dataset(datacache_home, "big", [{"name": "local", "mountPoint": str(src)}], LEVELS)
    cache_dir = os.path.join(datacache_home, "cache", "default", "big")
    client = plane.open_dataset("big")
    sampler = DuSampler(cache_dir)
    sampler.start()
    try:
        result = warmup(client)
    finally:
        sampler.stop()
    assert sampler.samples > 10
    assert sampler.peak <= QUOTA + BLOCK, f"cache dir reached {sampler.peak} bytes"
    # Reported, not silently "Complete": what did not fit is named.
    (target,) = result.targets
    assert target.phase == "Failed"
    assert any("quota" in f for f in target.failures)
    cached = [e.path for e in client.manifest if client.cached_fraction(e) == 1.0]
    assert 0 < len(cached) < 64
    assert target.cached_bytes == client.cached_bytes() == len(cached) * 4 * MiB
    # Eviction runs from the high to the low watermark: what is left sits between them.
    assert 0.80 * QUOTA - BLOCK <= len(cached) * BLOCK <= 0.95 * QUOTA
    client.close()


def test_c1_least_recently_used_blocks_go_first(datacache_home, tmp_path):
    src = tmp_path / "src"
    _make_files(src, 24, 4 * MiB)  # 96 MiB through a 64 MiB cache, one file (block) at a time
    plane = apply_dataset(datacache_home, "lru", [{"name": "local", "mountPoint": str(src)}], LEVELS)
    client = plane.open_dataset("lru")
    order = [e.path for e in client.manifest]
    warmup(client, order[:12], parallel=1)
    assert client.open(order[0]).read(10)  # order[0] becomes the most recently used
    # 9 more files: eviction stops at the low watermark (about 11 blocks kept), so order[0], the
    # 10th most recently used, stays while order[1..] go
    loaded = order[:21]
    warmup(client, loaded[12:], parallel=1)
    cached = [p for p in loaded if client.cached_fraction(client.stat(p)) == 1.0]
    assert order[0] in cached and loaded[-1] in cached
    # Everything else that survived is the most recently loaded run of files, in order.
    rest = [p for p in cached if p != order[0]]
    assert rest == loaded[-len(rest):]
    assert order[1] not in cached
    client.close()


def test_c2_concurrent_readers_hold_the_quota_while_they_run(datacache_home, tmp_path):
    src = tmp_path / "src"
    _make_files(src, 8, 32 * MiB)  # 8 readers x 32 MiB = 256 MiB through a 64 MiB cache
    plane = apply_dataset(datacache_home, "par", [{"name": "local", "mountPoint": str(src)}], LEVELS)
    cache_dir = os.path.join(datacache_home, "cache", "default", "par")
    client = plane.open_dataset("par")
    sums, errors = {}, []

    def reader(path):
        try:
            with client.open(path) as f:
                sums[path] = f.read()
        except Exception as err:  # surfaced below
            errors.append(err)

    sampler = DuSampler(cache_dir)
    sampler.start()
    threads = [threading.Thread(target=reader, args=(f"f{i:03d}.bin",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sampler.stop()
    assert not errors
    for i in range(8):
        assert sums[f"f{i:03d}.bin"] == (src / f"f{i:03d}.bin").read_bytes()
    assert sampler.peak <= QUOTA + BLOCK, f"cache dir reached {sampler.peak} bytes"
    client.close()


def test_capacity_is_what_a_smaller_device_holds_and_the_quota_on_a_larger_one(tmp_path, small_tmpfs):
    """A 1 GiB quota on a 6 MiB device: cacheCapacity (and a worker's capacity) is what the tier
    can hold there, its bytes plus the device's free bytes above the free-space reserve; it used
    to show the quota. On a device larger than the quota it is the quota."""
    from datacache.cache.disk import DiskTier

    tier = DiskTier(str(small_tmpfs / "ssd"), 1 << 30)
    big = DiskTier(str(tmp_path / "ssd"), 64 << 20)
    try:
        for i in range(3):
            capacity = tier.capacity()
            st = os.statvfs(tier.path)
            room = st.f_bavail * st.f_frsize - int(tier.free_space_ratio * st.f_blocks * st.f_frsize)
            assert capacity == tier.used() + room, (i, capacity)
            assert capacity <= st.f_blocks * st.f_frsize == 6 << 20
            assert tier.put(f"f/{i}", os.urandom(1 << 20))
        assert tier.used() >= 3 << 20
        assert big.capacity() == 64 << 20
    finally:
        tier.close()
        big.close()


def test_capacity_and_use_are_the_disk_level_even_when_mem_is_larger(tmp_path):
    """Blocks are written to the first disk level and MEM holds copies of hot ones: capacity and use
    (cacheCapacity, a worker's used bytes) are that level's, whatever MEM's quota is."""
    from datacache.cache.disk import DiskTier
    from datacache.cache.memory import MemoryTier
    from datacache.cache.tiered import TieredStore

    store = TieredStore([MemoryTier(2 << 30), DiskTier(str(tmp_path / "ssd"), 1 << 30)])
    try:
        blocks = {f"k{i}": os.urandom(100_000) for i in range(3)}
        for key, data in blocks.items():
            assert store.put(key, data)
        for key in blocks:  # second access promotes to MEM: still counted once
            store.get(key), store.get(key)
        assert store.capacity == 1 << 30
        assert store.used() == store.levels[1].used() >= 300_000
        assert store.levels[0].used() == 300_000
    finally:
        store.close()


def _free_fraction(path) -> float:
    st = os.statvfs(path)
    return st.f_bavail / st.f_blocks


def test_a_device_smaller_than_the_quota_keeps_a_tenth_of_it_free_by_eviction(small_tmpfs):
    """A quota the device cannot hold (6 MiB tmpfs, 64 MiB quota): puts evict to keep
    FREE_SPACE_RATIO of the device free, instead of filling it (where SQLite's mapped WAL index
    can die of SIGBUS on btrfs); every block kept reads back right."""
    from datacache.cache.disk import FREE_SPACE_RATIO, DiskTier

    tier = DiskTier(str(small_tmpfs / "ssd"), QUOTA, block_size=MiB, free_space_ratio=FREE_SPACE_RATIO)
    blocks = {f"ds/{'c' * 32}/{i}": os.urandom(MiB) for i in range(12)}
    try:
        for key, data in blocks.items():
            assert tier.put(key, data)  # room made by evicting the oldest
            # the reserve also takes the index's growth after the put: a little of it may go
            assert _free_fraction(small_tmpfs) >= 0.8 * FREE_SPACE_RATIO
        kept = [key for key in blocks if key in tier]
        assert 2 <= len(kept) <= 5 and kept == list(blocks)[-len(kept):]  # the newest, LRU
        assert tier.full_bypasses > 0 and tier.evictions == 12 - len(kept) and tier.healthy
        for key in kept:
            assert bytes(tier.get(key)) == blocks[key]
    finally:
        tier.close()


def test_a_device_filled_by_other_files_skips_puts_and_keeps_the_tiers_blocks(small_tmpfs):
    from datacache.cache.disk import FREE_SPACE_RATIO, DiskTier

    tier = DiskTier(str(small_tmpfs / "ssd"), QUOTA, block_size=MiB, free_space_ratio=FREE_SPACE_RATIO)
    first = os.urandom(MiB)
    try:
        assert tier.put(f"ds/{'d' * 32}/0", first)
        with open(small_tmpfs / "other", "wb") as f:  # someone else's file takes the rest
            while _free_fraction(small_tmpfs) > 0.05:
                f.write(bytes(256 << 10))
        assert tier.put(f"ds/{'d' * 32}/1", os.urandom(MiB)) is False  # evicting the 1 MiB would not do
        assert bytes(tier.get(f"ds/{'d' * 32}/0")) == first and tier.healthy
    finally:
        tier.close()


def _fill_to_zero(device) -> None:
    """Someone else's file takes every byte left on ``device``."""
    fd = os.open(device / "other", os.O_WRONLY | os.O_CREAT)
    with contextlib.suppress(OSError):
        while os.write(fd, bytes(4096)):
            pass
    os.close(fd)
    assert os.statvfs(device).f_bavail == 0


def test_reads_at_0_bytes_free_come_from_the_blocks_and_leave_the_tier_healthy(small_tmpfs, caplog):
    """A whole cache file's first hand-out records it in the index, which a device at 0 bytes
    free refuses ("database or disk is full"): it raised, and FUSE answered every open EIO. Now
    the file is not handed out and its blocks read back right; a full device is no damage. A tier
    opened there says the device is full (SQLite's "disk I/O error" pointed at permissions)."""
    from datacache.cache.disk import DEVICE_FULL, FREE_SPACE_RATIO, DiskTier

    tier = DiskTier(str(small_tmpfs / "ssd"), QUOTA, block_size=MiB, free_space_ratio=0)
    file = f"ds/{'a' * 32}"
    blocks = [os.urandom(MiB), os.urandom(MiB // 2)]
    try:
        for i, data in enumerate(blocks):
            assert tier.put(f"{file}/{i}", data)
        tier._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        _fill_to_zero(small_tmpfs)
        assert tier.open_whole(file, MiB + MiB // 2, 2) is None
        assert [bytes(tier.get(f"{file}/{i}")) for i in range(2)] == blocks and tier.healthy
    finally:
        tier.close()
    with caplog.at_level("WARNING", logger="datacache.cache.disk"):
        other = DiskTier(str(small_tmpfs / "other-ssd"), QUOTA, block_size=MiB, free_space_ratio=FREE_SPACE_RATIO)
    try:
        assert not other.healthy and other.put(f"{file}/0", blocks[0]) is False
        assert [r.getMessage() for r in caplog.records] == [
            f"cache tier {small_tmpfs / 'other-ssd'} (SSD) cannot be used, reads go to the UFS uncached: "
            f"{DEVICE_FULL} (tried again every 30 s)"]
    finally:
        other.close()


def test_a_device_too_full_for_the_index_to_record_an_eviction_frees_a_cache_file_first(small_tmpfs):
    """At 0 bytes free the index cannot record an eviction (SQLite: "database or disk is full"),
    and a tier that evicts only after recording stayed full for good (1 btrfs fill of 12). The
    oldest cache file goes first, then its rows: the device has room for the new block, the
    index names no block whose file is gone, and the blocks kept read back right."""
    from datacache.cache.disk import FREE_SPACE_RATIO, DiskTier

    tier = DiskTier(str(small_tmpfs / "ssd"), QUOTA, block_size=MiB, free_space_ratio=FREE_SPACE_RATIO)
    old, kept, new = f"ds/{'a' * 32}", f"ds/{'b' * 32}", f"ds/{'c' * 32}/0"
    blocks = {f"{old}/0": os.urandom(MiB), f"{old}/1": os.urandom(MiB), f"{kept}/0": os.urandom(MiB)}
    try:
        for key, data in blocks.items():
            assert tier.put(key, data)
        tier._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the index's next write needs new space
        _fill_to_zero(small_tmpfs)
        blocks[new] = os.urandom(MiB)
        assert tier.put(new, blocks[new])  # in the room the old file's 2 MiB left
        assert tier.emergency_unlinks == 1 and tier.healthy
        assert sorted(tier.keys()) == [f"{kept}/0", new]
        assert all(bytes(tier.get(key)) == blocks[key] for key in (f"{kept}/0", new))
    finally:
        tier.close()


def test_puts_of_many_threads_at_once_leave_the_free_space_and_the_tier_healthy(small_tmpfs, monkeypatch):
    """Blocks reserved and still being written do not show in ``statvfs``: 8 threads putting
    at once must count them, or together they fill the device (the write fails with ENOSPC, and
    so may the index's next write, wedging the tier). Nor may making room evict a block another
    put is writing (its bytes land all the same), nor count a block twice once its space is
    allocated (a storm then evicted what it did not need and could keep none). The device keeps
    its reserve, the blocks kept (3-4 of the 4 that fit, here) read back right, and once the
    lag after an eviction that did not show is over, the tier takes a block again."""
    from datacache.cache import disk
    from datacache.cache.disk import FREE_SPACE_RATIO, DiskTier

    tier = DiskTier(str(small_tmpfs / "ssd"), QUOTA, block_size=MiB, free_space_ratio=FREE_SPACE_RATIO)
    blocks = {f"ds/{chr(ord('a') + t) * 32}/{i}": os.urandom(MiB) for t in range(8) for i in range(4)}
    start, lowest, errors = threading.Barrier(8), [1.0], []

    def putter(t: int) -> None:
        start.wait()
        try:
            for i in range(4):
                tier.put(f"ds/{chr(ord('a') + t) * 32}/{i}", blocks[f"ds/{chr(ord('a') + t) * 32}/{i}"])
                lowest[0] = min(lowest[0], _free_fraction(small_tmpfs))
        except Exception as err:  # surfaced below
            errors.append(err)

    threads = [threading.Thread(target=putter, args=(t,)) for t in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert tier.healthy and tier.write_errors == 0
        assert lowest[0] >= 0.5 * FREE_SPACE_RATIO, f"the device was left {lowest[0]:.1%} free"
        kept = [key for key in blocks if key in tier]
        assert len(kept) >= 2 and all(bytes(tier.get(key)) == blocks[key] for key in kept)
        monkeypatch.setattr(disk, "ROOM_LAG_S", 0.0)  # as if its 30 s had passed
        late = os.urandom(MiB)
        assert tier.put(f"ds/{'z' * 32}/0", late)  # the tier still takes blocks
        assert bytes(tier.get(f"ds/{'z' * 32}/0")) == late
    finally:
        tier.close()


def test_the_free_space_reserve_is_the_levels_freespaceratio_else_the_nodes_default(datacache_home, tmp_path,
                                                                                     monkeypatch):
    """``freeSpaceRatio`` of a level, else ``DATACACHE_FREE_SPACE_RATIO``, else 0.1; a bad value
    of either is refused with its name and the fix."""
    import pytest

    from datacache.cache.disk import FREE_SPACE_ENV, FREE_SPACE_RATIO
    from datacache.errors import ConfigError

    src = tmp_path / "src"
    _make_files(src, 1, MiB)
    mounts = [{"name": "local", "mountPoint": str(src)}]

    def ratio(name: str, **level) -> float:
        plane = apply_dataset(datacache_home, name, mounts, [{**LEVELS[0], "path": name, **level}])
        client = plane.open_dataset(name)
        try:
            return client.source.store.levels[0].free_space_ratio
        finally:
            client.close()

    monkeypatch.setenv(FREE_SPACE_ENV, "0.2")
    assert ratio("own", freeSpaceRatio=0.25) == 0.25
    assert ratio("node") == 0.2
    monkeypatch.delenv(FREE_SPACE_ENV)
    assert ratio("default") == FREE_SPACE_RATIO == 0.1
    monkeypatch.setenv(FREE_SPACE_ENV, "lots")
    with pytest.raises(ConfigError) as bad_env:
        ratio("badenv")
    assert str(bad_env.value) == ("DATACACHE_FREE_SPACE_RATIO: 'lots' is not a fraction of the cache device in "
                                  "[0, 1): set it like 0.05, or unset it for 0.1")
    with pytest.raises(ConfigError) as bad_field:
        ratio("badfield", freeSpaceRatio=1.5)
    assert "spec.tieredstore.levels[0].freeSpaceRatio" in str(bad_field.value), str(bad_field.value)


def test_a_tier_keeps_its_free_space_ratio_of_the_device_free(small_tmpfs):
    """Half of a 6 MiB tmpfs kept free: at most 2 of 6 blocks of 1 MiB stay, the newest."""
    from datacache.cache.disk import DiskTier

    tier = DiskTier(str(small_tmpfs / "ssd"), QUOTA, block_size=MiB, free_space_ratio=0.5)
    blocks = {f"ds/{'e' * 32}/{i}": os.urandom(MiB) for i in range(6)}
    try:
        for key, data in blocks.items():
            tier.put(key, data)
            assert _free_fraction(small_tmpfs) >= 0.4
        kept = [key for key in blocks if key in tier]
        assert 1 <= len(kept) <= 2 and kept == list(blocks)[-len(kept):]
        assert all(bytes(tier.get(key)) == blocks[key] for key in kept) and tier.healthy
    finally:
        tier.close()


def test_an_eviction_that_made_the_room_stores_the_block_on_one_look(tmp_path):
    """After an eviction for room the shortfall is measured once: puts of other threads change
    it, and a second look that found the device short where the first did not (so no commit was
    asked) took the frees for not shown yet, and on btrfs the tier then skipped 40k puts in 5 s.
    Here the device looks short before the eviction and has room after it, then short again."""
    from datacache.cache.disk import DiskTier

    tier = DiskTier(str(tmp_path / "ssd"), QUOTA, block_size=MiB)
    blocks = {f"ds/{'f' * 32}/{i}": os.urandom(MiB) for i in range(4)}
    try:
        for key, data in list(blocks.items())[:3]:
            assert tier.put(key, data)
        answers = iter([MiB, 0, MiB])  # before the eviction, after it, and a later look
        tier._shortfall = lambda size: next(answers)
        assert tier.put(f"ds/{'f' * 32}/3", blocks[f"ds/{'f' * 32}/3"])
        assert next(answers) == MiB  # no third look
        assert tier.evictions >= 1 and tier.full_bypasses == 1 and tier.commits == 0
        kept = [key for key in blocks if key in tier]
        assert kept[-1] == f"ds/{'f' * 32}/3" and all(bytes(tier.get(k)) == blocks[k] for k in kept)
    finally:
        tier.close()
