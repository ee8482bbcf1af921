"""A warmup larger than the page cache could keep is written around it (O_DIRECT, as the kernel's
cachefiles writes its cache): it neither evicts what readers use nor pays for filling pages
nobody reads yet. A smaller warmup and a reader's fill, read again soon, go through the page
cache; a file system that refuses O_DIRECT takes the same bytes buffered. Residency is what
util-linux's ``fincore`` reports."""

from __future__ import annotations

import hashlib
import os
import subprocess

from datacache.cache.disk import DiskTier
from datacache.cache.extents import DIRECT_ALIGN, write_range
from datacache.warmup import warmup
from support import apply_dataset

MiB = 1 << 20


def resident(path: str) -> int:
    """Bytes of ``path`` in the page cache (``fincore``)."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES", path],
                         check=True, capture_output=True, text=True).stdout
    return int(out.strip())


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def without_a_drop(tmp_path, step, attempts: int = 3):
    """``step(attempt)``'s result from an attempt during which no other test dropped the page cache
    (tests/fuse/test_fuse_versions.py and the benchmark smoke tests do, as root): a canary file of
    clean pages, read back in before each attempt, must still be resident after it. The last
    attempt's result when every attempt met a drop."""
    canary = tmp_path / "canary"
    if not canary.exists():
        with open(canary, "wb") as f:
            f.write(os.urandom(MiB))
            os.fsync(f.fileno())
    for attempt in range(attempts):
        canary.read_bytes()
        result = step(attempt)
        if resident(str(canary)) == MiB:
            break
    return result


def test_a_direct_write_leaves_only_its_unaligned_tail_in_the_page_cache(tmp_path):
    data = os.urandom(3 * MiB + 1000)

    def write(attempt: int):
        direct, buffered = str(tmp_path / f"direct{attempt}"), str(tmp_path / f"buffered{attempt}")
        assert write_range(direct, 4 * MiB, data, 0o600, direct=True)
        assert write_range(buffered, 4 * MiB, data, 0o600)
        return direct, buffered, resident(direct), resident(buffered)

    direct, buffered, direct_resident, buffered_resident = without_a_drop(tmp_path, write)
    assert direct_resident <= DIRECT_ALIGN  # the 1000-byte tail's page
    assert buffered_resident >= 3 * MiB
    for path in (direct, buffered):
        assert os.stat(path).st_mode & 0o777 == 0o600
        with open(path, "rb") as f:
            assert f.read(4 * MiB) == bytes(4 * MiB)  # the range before it is a hole
            assert _sha(f.read()) == _sha(data)


def test_an_unaligned_offset_is_written_through_the_page_cache(tmp_path):
    path = str(tmp_path / "f")
    data = os.urandom(2 * MiB)
    assert write_range(path, 100, data, 0o600, direct=True)  # not refused: just not alignable
    assert resident(path) >= 2 * MiB
    with open(path, "rb") as f:
        f.seek(100)
        assert f.read() == data


def test_a_file_system_that_refuses_o_direct_takes_bulk_puts_buffered(ramfs, caplog):
    block = 1 * MiB
    tier = DiskTier(str(ramfs / "ssd"), 16 * block, block_size=block)
    blocks = [os.urandom(block), os.urandom(block - 5)]
    file = "ds/" + "b" * 32
    try:
        with caplog.at_level("INFO", logger="datacache"):
            for i, data in enumerate(blocks):
                assert tier.put(f"{file}/{i}", data, bulk=True)
        assert tier.direct_io is False
        refusals = [r.getMessage() for r in caplog.records if "refuses O_DIRECT" in r.getMessage()]
        assert len(refusals) == 1 and str(ramfs / "ssd") in refusals[0]  # said once, not per block
        for i, data in enumerate(blocks):
            assert _sha(bytes(tier.get(f"{file}/{i}"))) == _sha(data)
    finally:
        tier.close()


def test_a_load_larger_than_ram_goes_around_the_page_cache_a_smaller_one_and_readers_through_it(
        datacache_home, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    files = {"bulk.bin": os.urandom(9 * MiB + 123), **{f"small{i}.bin": os.urandom(6 * MiB + 5) for i in range(3)},
             **{f"read{i}.bin": os.urandom(5 * MiB) for i in range(3)}}  # one per attempt (without_a_drop)
    for name, data in files.items():
        (src / name).write_bytes(data)
    plane = apply_dataset(datacache_home, "bulk", [{"name": "local", "mountPoint": str(src)}])
    client = plane.open_dataset("bulk")
    try:
        # bulk_over=0 stands for a load larger than half the RAM (the default's threshold)
        result = warmup(client, ["bulk.bin"], bulk_over=0)
        assert result.ok and result.loaded_bytes == len(files["bulk.bin"])
        disk = client.source.store.levels[-1]

        def cache_file(name: str) -> str:
            return disk.block_file(str(client.source.key(client.stat(name), 0)))

        def load_small(attempt: int) -> tuple[str, int]:
            name = f"small{attempt}.bin"
            result = warmup(client, [name])  # 6 MiB: far below half of any machine's RAM
            assert result.ok and result.loaded_bytes == len(files[name])
            return name, resident(cache_file(name))

        def read_missing(attempt: int) -> tuple[str, int]:
            name = f"read{attempt}.bin"
            with client.open(name) as f:
                assert _sha(f.read()) == _sha(files[name])  # a miss: filled by the reader
            return name, resident(cache_file(name))

        assert resident(cache_file("bulk.bin")) <= DIRECT_ALIGN  # only the last block's unaligned tail page
        small, small_resident = without_a_drop(tmp_path, load_small)
        assert small_resident >= len(files[small])  # whole pages
        read, read_resident = without_a_drop(tmp_path, read_missing)
        assert read_resident >= len(files[read])
        before = client.source.ufs_bytes
        for name in ("bulk.bin", small):
            with client.open(name) as f:
                assert _sha(f.read()) == _sha(files[name])
        assert client.source.ufs_bytes == before  # served from the cache files, not the UFS
    finally:
        client.close()
        plane.close()
