"""``datacache://`` plain-file opens (issue 17 items 4 and 6): with the in-process cache, a file
version whose blocks are all on the disk level opens as a plain local file object over the disk
tier's own cache file of it (no copy, no file tier directory); a new version never opens the old
version's file; ``fileTier.quota: 0`` (the workers' copy) changes nothing here."""

from __future__ import annotations

import hashlib
import io
import os

import fsspec
import pytest

from datacache.cached_file import MAP_MIN, CachedFile
from datacache.warmup import warmup
from datacache.stack import layout
from support import apply_dataset

BS = 64 << 10


def _dataset(datacache_home, tmp_path, file_tier: dict | None = None):
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(5 * BS + 123)
    (src / "shard.bin").write_bytes(data)
    (src / "small.bin").write_bytes(os.urandom(BS // 2))
    levels = [{"mediumtype": "SSD", "path": "cache", "quota": "64Mi"}]
    plane = apply_dataset(datacache_home, "ft", [{"name": "local", "mountPoint": str(src)}], levels, block_size="64Ki")
    if file_tier is not None:
        runtime = plane.get("CacheRuntime", "ft")
        runtime.spec.tieredstore.file_tier = runtime.spec.tieredstore.file_tier.model_validate(file_tier)
        plane.apply([runtime])
    return plane, src, data


def test_a_complete_version_opens_as_a_plain_local_file(datacache_home, tmp_path):
    plane, src, data = _dataset(datacache_home, tmp_path)
    fs = fsspec.filesystem("datacache", home=str(plane.home), skip_instance_cache=True)
    client = fs._client("ft")
    try:
        entry = client.stat("shard.bin")
        with fs.open("ft/shard.bin") as f:  # not cached yet: blocks
            assert not isinstance(f, io.BufferedReader)
            assert f.read() == data
        hits_before = client.source.hit_counts()
        with fs.open("ft/shard.bin") as f:  # complete now: the disk tier's file of the version
            assert isinstance(f, io.BufferedReader)
            key = client.source.key(entry, 0)
            assert os.path.samestat(os.fstat(f.fileno()), os.stat(client.source.store.block_file(str(key))))
            f.seek(3 * BS + 7)
            assert f.read(100) == data[3 * BS + 7:3 * BS + 107]
            f.seek(0)
            assert hashlib.sha256(f.read()).digest() == hashlib.sha256(data).digest()
        assert client.source.hit_counts() == hits_before  # no block read at all
        directory, _ = layout.file_tier(plane.home, plane.get("CacheRuntime", "ft"))
        assert not os.path.exists(directory)  # no second copy of the version
        assert oct(os.stat(client.source.store.block_file(str(key))).st_mode & 0o777) == "0o600"
        with fs.open("ft/small.bin") as f:  # one block: read as a block, nothing to gain
            assert not isinstance(f, io.BufferedReader)
            f.read()

        new = os.urandom(4 * BS)  # a new version after a sync: its own file id, never the old file
        (src / "shard.bin").write_bytes(new)
        plane.sync("ft")
        client.namespace.reload()
        with fs.open("ft/shard.bin") as f:
            assert not isinstance(f, io.BufferedReader)
            assert f.read() == new
    finally:
        fs.close()
        plane.close()


def test_quota_zero_of_the_file_tier_leaves_the_disk_tiers_files_in_use(datacache_home, tmp_path):
    plane, _, data = _dataset(datacache_home, tmp_path, {"quota": 0})
    client = plane.open_dataset("ft")
    try:
        assert client.files is None
        entry = client.stat("shard.bin")
        assert client.local_file(entry) is None  # not cached yet
        warmup(client, ["shard.bin"])
        with open(client.local_file(entry), "rb") as f:
            assert hashlib.sha256(f.read()).digest() == hashlib.sha256(data).digest()
        with client.open("shard.bin") as f:
            assert f.read() == data
    finally:
        client.close()
        plane.close()


def test_a_plain_file_open_keeps_its_bytes_while_the_cache_evicts_it(datacache_home, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(5 * BS + 123)
    (src / "shard.bin").write_bytes(data)
    others = [f"other{i}.bin" for i in range(8)]
    for name in others:  # 8 x 10 blocks through a 64-block quota: the shard's file goes
        (src / name).write_bytes(os.urandom(10 * BS))
    levels = [{"mediumtype": "SSD", "path": "cache", "quota": "4Mi", "high": 0.95, "low": 0.5}]
    plane = apply_dataset(datacache_home, "ev", [{"name": "local", "mountPoint": str(src)}], levels, block_size="64Ki")
    fs = fsspec.filesystem("datacache", home=str(plane.home), skip_instance_cache=True)
    client = fs._client("ev")
    try:
        entry = client.stat("shard.bin")
        assert warmup(client, ["shard.bin"]).ok
        with fs.open("ev/shard.bin") as f:
            assert isinstance(f, io.BufferedReader)  # the disk tier's cache file, handed out whole
            path = client.source.store.block_file(str(client.source.key(entry, 0)))
            head = f.read(100)
            for name in others:
                warmup(client, [name])
            assert not os.path.exists(path) and client.cached_fraction(entry) == 0.0  # evicted: unlinked
            assert os.fstat(f.fileno()).st_nlink == 0
            rest = f.read()
        assert hashlib.sha256(head + rest).digest() == hashlib.sha256(data).digest()
        used, capacity = client.usage()
        assert capacity == 4 << 20 and used <= capacity
    finally:
        fs.close()
        plane.close()


def test_pyarrow_reads_a_complete_version_from_views_of_its_cache_file(datacache_home, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "src"
    src.mkdir()
    table = pa.table({"id": pa.array(range(400_000), pa.int64()), "x": pa.array(range(400_000), pa.float64())})
    pq.write_table(table, src / "t.parquet", row_group_size=100_000, compression="none")
    size = (src / "t.parquet").stat().st_size
    assert size >= MAP_MIN  # mapped, not copied
    small = os.urandom(1000)
    (src / "small.bin").write_bytes(small)
    levels = [{"mediumtype": "SSD", "path": "cache", "quota": "64Mi"}]
    plane = apply_dataset(datacache_home, "pq", [{"name": "local", "mountPoint": str(src)}], levels, block_size="64Ki")
    fs = fsspec.filesystem("datacache", home=str(plane.home), skip_instance_cache=True)
    client = fs._client("pq")
    try:
        assert warmup(client, ["t.parquet", "small.bin"]).ok
        with fs.open("pq/t.parquet") as f:
            assert isinstance(f, CachedFile) and f.name == "t.parquet"
            pf = pq.ParquetFile(f)
            assert pf.metadata.num_row_groups == 4
            for i in (3, 0, 2):
                assert pf.read_row_group(i).equals(table.slice(i * 100_000, 100_000))
            f.seek(size - 4096)
            got = pa.PythonFile(f, mode="r").read_buffer(4096)  # pyarrow's own adapter, as ParquetFile uses
            f.seek(size - 4096)
            view = f.read_buffer(10_000)  # short at EOF
            assert isinstance(view, memoryview) and len(view) == 4096 and f.tell() == size
            assert got.address == pa.py_buffer(view).address  # the same bytes of the mapping: no copy
            assert f.read_buffer(10) == b"" and f.tell() == size
            f.seek(size + 5)  # past EOF, as io allows
            assert f.read_buffer() == b"" and f.tell() == size + 5
            f.seek(7)
            rest = f.read_buffer()
            assert f.read() == b""
        assert hashlib.sha256(rest).digest() == hashlib.sha256((src / "t.parquet").read_bytes()[7:]).digest()
        with pytest.raises(ValueError, match="closed file"):
            f.read_buffer(1)
        with fs.open("pq/small.bin") as f:
            assert isinstance(f, CachedFile)
            f.seek(10)
            part = f.read_buffer(100)  # below MAP_MIN: a copy
            assert type(part) is bytes and part == small[10:110] and f.tell() == 110
    finally:
        fs.close()
        plane.close()
