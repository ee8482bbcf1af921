"""Reader semantics: C6 (exact tail, reads past EOF), C8 (missing paths), seek/tell/readinto,
single-flight fills, checksum verification of stored blocks, and the memory budget: readers that
wait for it never deadlock, and threads sharing one open file give back all they held."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import random
import threading
import time

import fsspec
import pytest

from datacache.stack import readpath
from support import apply_dataset, s3_mount

MiB = 1 << 20


@pytest.fixture
def big_local(datacache_home, tmp_path):
    """A 512 MiB sparse local file with random head and tail, in a dataset."""
    src = tmp_path / "src"
    src.mkdir()
    head, tail = os.urandom(MiB), os.urandom(8192 + 17)
    size = 512 * MiB
    with open(src / "big.bin", "wb") as f:
        f.write(head)
        f.seek(size - len(tail))
        f.write(tail)
    plane = apply_dataset(datacache_home, "big", [{"name": "local", "mountPoint": str(src)}])
    return plane, head, tail, size


def test_c6_exact_last_4096_bytes_and_reads_past_eof(big_local):
    plane, _, tail, size = big_local
    client = plane.open_dataset("big")
    with client.open("big.bin") as f:
        f.seek(-4096, io.SEEK_END)
        assert f.tell() == size - 4096
        assert f.read(4096) == tail[-4096:]
        assert f.read(10) == b""  # at EOF: empty, not an error
        f.seek(size + 1000)
        assert f.read(100) == b""  # past EOF too
        assert f.pread(size - 10, 100) == tail[-10:]  # short read across EOF
    fs = fsspec.filesystem("datacache", home=str(plane.home), skip_instance_cache=True)
    assert fs.cat_file("big/big.bin", start=-4096) == tail[-4096:]
    assert fs.cat_file("big/big.bin", start=size, end=size + 10) == b""
    # Only the blocks under the tail were fetched, not the 512 MiB file.
    assert client.source.ufs_bytes <= 2 * 4 * MiB
    fs.close()
    client.close()


def test_c6_tail_of_s3_object(datacache_home, s3_bucket, moto_server, moto_secrets):
    fs, bucket = s3_bucket
    data = os.urandom(9 * MiB + 4321)
    fs.pipe(f"{bucket}/obj.bin", data)
    plane = apply_dataset(datacache_home, "s3t", [s3_mount(moto_server, bucket)])
    client = plane.open_dataset("s3t")
    with client.open("obj.bin") as f:
        f.seek(-4096, io.SEEK_END)
        assert f.read() == data[-4096:]
        assert f.read() == b""
    client.close()


def test_seek_tell_readinto_and_buffered_reads_match_the_source(big_local):
    plane, head, _, _ = big_local
    client = plane.open_dataset("big")
    with client.open("big.bin") as f:
        buf = bytearray(1000)
        assert f.readinto(buf) == 1000 and bytes(buf) == head[:1000]
        assert f.tell() == 1000
        f.seek(500, io.SEEK_CUR)
        assert f.read(10) == head[1500:1510]
        with pytest.raises(OSError):
            f.seek(-1)
        # Across a block boundary (blocks are 4 MiB): zeros after the random head.
        f.seek(4 * MiB - 5)
        assert f.read(10) == b"\0" * 10
    with io.BufferedReader(client.open("big.bin"), 64 * 1024) as f:
        assert f.read(MiB) == head
    with pytest.raises(ValueError):
        f.read(1)
    client.close()


def test_a_float_offset_is_a_type_error_as_for_a_local_file(big_local):
    plane, *_ = big_local
    client = plane.open_dataset("big")
    with client.open("big.bin") as f, pytest.raises(TypeError, match="'float' object cannot be interpreted"):
        f.seek(2.5)
    fs = fsspec.filesystem("datacache", home=str(plane.home), skip_instance_cache=True)
    with pytest.raises(TypeError, match="'float' object cannot be interpreted"):
        fs.cat_file("big/big.bin", start=1.5, end=10)
    assert client.source.ufs_bytes == 0  # refused before any read
    fs.close()
    client.close()


def _cold_files(tmp_path, n: int, size: int) -> tuple[str, dict[str, str]]:
    src = tmp_path / "src"
    src.mkdir()
    sums = {}
    for i in range(n):
        data = os.urandom(size)
        (src / f"f{i}.bin").write_bytes(data)
        sums[f"f{i}.bin"] = hashlib.sha256(data).hexdigest()
    return str(src), sums


def test_readers_waiting_for_the_memory_budget_never_deadlock(datacache_home, tmp_path, monkeypatch):
    """More cold files read at once than the budget has blocks for: a demand read that must wait
    for the budget waits outside the lock that finishing fills take to give theirs back (it hung
    for good: every fill blocked on that lock, the reader on the budget)."""
    monkeypatch.setattr(readpath, "READAHEAD_BUDGET", 6 * MiB)
    src, sums = _cold_files(tmp_path, 6, 24 * MiB)
    plane = apply_dataset(datacache_home, "tight", [{"name": "local", "mountPoint": src}], block_size="1Mi")
    client = plane.open_dataset("tight")
    got = {}

    def read(name):
        h = hashlib.sha256()
        with client.open(name) as f:
            while chunk := f.read(MiB):
                h.update(chunk)
        got[name] = h.hexdigest()

    threads = [threading.Thread(target=read, args=(name,), daemon=True) for name in sums]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert got == sums, f"{len(got)} of {len(sums)} readers finished"
    client.close()
    assert client.source.readahead.budget.used == 0


def test_a_load_ahead_the_budget_had_no_room_for_is_not_held(datacache_home, tmp_path, monkeypatch):
    """``holds`` promises a read without I/O: a load ahead that gave up for lack of budget must not
    count as held (a read of that block goes to the disk or the UFS)."""
    monkeypatch.setattr(readpath, "READAHEAD_BUDGET", MiB)  # a hold needs half the budget free: never here
    src, _ = _cold_files(tmp_path, 1, 8 * MiB)
    data = open(os.path.join(src, "f0.bin"), "rb").read()
    plane = apply_dataset(datacache_home, "nohold", [{"name": "local", "mountPoint": src}], block_size="1Mi")
    client = plane.open_dataset("nohold")
    with client.open("f0.bin") as f:
        assert f.read(2 * MiB) == data[:2 * MiB]  # blocks 0 and 1: a run, so blocks 2 and 3 would load ahead
        assert not f.holds(2) and not f.holds(3)
        assert not f._ahead  # no load ahead was started without room to hold its block
        assert f.read(MiB) == data[2 * MiB:3 * MiB]
    client.close()


def test_threads_sharing_one_open_file_give_back_all_they_held(datacache_home, tmp_path):
    src, _ = _cold_files(tmp_path, 1, 40 * MiB)
    data = open(os.path.join(src, "f0.bin"), "rb").read()
    plane = apply_dataset(datacache_home, "shared", [{"name": "local", "mountPoint": src}], block_size="1Mi")
    client = plane.open_dataset("shared")
    f = client.open("f0.bin")
    errors = []

    def preads(seed):
        rng = random.Random(seed)
        for _ in range(150):
            off, n = rng.randrange(len(data)), rng.choice([MiB, MiB + 1, 4095])
            if f.pread(off, n) != data[off:off + n]:
                errors.append((off, n))
        for off in range(0, len(data), MiB):  # a sequential run too: loads ahead in the pool
            if f.pread(off, MiB) != data[off:off + MiB]:
                errors.append((off, MiB))

    threads = [threading.Thread(target=preads, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    f.close()
    budget = client.source.readahead.budget
    deadline = time.monotonic() + 30  # loads still running land (and give back) first
    while budget.used and time.monotonic() < deadline:
        time.sleep(0.02)
    assert errors == [] and budget.used == 0
    client.close()


def test_c8_missing_paths_are_file_not_found(big_local):
    plane, *_ = big_local
    client = plane.open_dataset("big")
    for path in ("nope.bin", "dir/nope", "big.bin/child"):
        with pytest.raises(FileNotFoundError) as info:
            client.open(path)
        assert info.value.errno == errno.ENOENT
    fs = fsspec.filesystem("datacache", home=str(plane.home), skip_instance_cache=True)
    with pytest.raises(FileNotFoundError):
        fs.info("big/nope.bin")
    with pytest.raises(FileNotFoundError):
        fs.cat_file("big/nope.bin")
    with pytest.raises(FileNotFoundError):
        fs.ls("big/nodir")
    with pytest.raises(FileNotFoundError):
        fs.cat_file("nodataset/x")
    assert not fs.exists("big/nope.bin") and fs.exists("big/big.bin")
    with pytest.raises(PermissionError):
        fs.open("big/big.bin", "wb")
    fs.close()
    client.close()


def test_concurrent_readers_of_one_cold_block_share_one_ufs_fetch(datacache_home, s3_bucket, moto_server,
                                                                    moto_secrets):
    fs, bucket = s3_bucket
    data = os.urandom(4 * MiB)
    fs.pipe(f"{bucket}/one.bin", data)
    plane = apply_dataset(datacache_home, "sf", [s3_mount(moto_server, bucket)])
    client = plane.open_dataset("sf")
    barrier, got = threading.Barrier(8), []

    def read():
        barrier.wait()
        with client.open("one.bin") as f:
            got.append(hashlib.sha256(f.read()).hexdigest())

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [hashlib.sha256(data).hexdigest()] * 8
    assert client.source.ufs_bytes == len(data)  # one fetch for eight readers
    client.close()


def test_corrupt_block_on_disk_is_dropped_and_refetched(datacache_home, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(3 * MiB)
    (src / "f.bin").write_bytes(data)
    plane = apply_dataset(datacache_home, "cor", [{"name": "local", "mountPoint": str(src)}])
    client = plane.open_dataset("cor")
    assert client.open("f.bin").read() == data
    entry = client.stat("f.bin")
    disk = client.source.store.levels[-1]
    path = disk.block_file(str(client.source.key(entry, 0)))
    with open(path, "r+b") as f:
        f.seek(1000)
        f.write(b"\xff" * 16)
    before = client.source.ufs_bytes
    assert client.open("f.bin").read() == data  # never the corrupt bytes
    assert disk.corrupt == 1
    assert client.source.ufs_bytes - before == len(data)  # refetched from the UFS
    assert client.cached_fraction(entry) == 1.0
    client.close()


def test_many_open_files_stay_within_the_memory_budget(datacache_home, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(64):
        (src / f"f{i:02d}.bin").write_bytes(os.urandom(2 * MiB))
    plane = apply_dataset(datacache_home, "many", [{"name": "local", "mountPoint": str(src)}], block_size="1Mi")
    plane.warmup("many", [])
    client = plane.open_dataset("many")
    budget = client.source.readahead.budget
    budget.limit = 16 * MiB  # 64 handles x 1 MiB blocks would need four times this
    budget.peak = budget.used  # the peak of the reads below, not of the warmup's parallel fills
    files = [client.open(f"f{i:02d}.bin") for i in range(64)]
    for i, f in enumerate(files):  # 64 open handles, each mid-way through a block
        assert f.read(1000) == (src / f"f{i:02d}.bin").read_bytes()[:1000]
    assert budget.used == 8 * MiB  # half the budget holds blocks, the other half stays for fills
    assert budget.peak <= budget.limit
    for f in files:  # every handle still reads correctly, kept block or not
        f.seek(MiB + 5)
        assert len(f.read(10)) == 10
        f.close()
    assert budget.used == 0
    client.close()
