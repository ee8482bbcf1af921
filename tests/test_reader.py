"""Reader semantics: C6 (exact tail, reads past EOF), C8 (missing paths), seek/tell/readinto,
single-flight fills and checksum verification of stored blocks."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import threading

import fsspec
import pytest

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
    budget = client.source.budget
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
