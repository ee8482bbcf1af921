"""``datacache://`` over the file tier (issue 17 item 6): a file version complete in the cache is
copied once into the node's file tier, and later opens get a plain local file object over it;
a new version never opens the old version's file; deleting the dataset removes the tier;
``fileTier.quota: 0`` turns it off."""

from __future__ import annotations

import hashlib
import io
import os
import time

import fsspec

from datacache.warmup import warmup
from datacache.stack import layout
from support import apply_dataset

BS = 64 << 10


def _wait_for_file(client, entry, timeout: float = 30.0) -> None:
    fid = client.source.key(entry, 0).file_id
    deadline = time.monotonic() + timeout
    while not client.files.contains(fid):
        assert time.monotonic() < deadline, "the file was not copied into the file tier"
        time.sleep(0.05)


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
        with fs.open("ft/shard.bin") as f:  # not cached yet: blocks, and no copy
            assert not isinstance(f, io.BufferedReader)
            assert f.read() == data
        with fs.open("ft/shard.bin") as f:  # complete now: copied in the background
            assert not isinstance(f, io.BufferedReader)
        _wait_for_file(client, entry)
        hits_before = client.source.hit_counts()
        with fs.open("ft/shard.bin") as f:
            assert isinstance(f, io.BufferedReader)
            f.seek(3 * BS + 7)
            assert f.read(100) == data[3 * BS + 7:3 * BS + 107]
            f.seek(0)
            assert hashlib.sha256(f.read()).digest() == hashlib.sha256(data).digest()
        assert client.source.hit_counts() == hits_before  # no block read at all
        directory, quota = layout.file_tier(plane.home, plane.get("CacheRuntime", "ft"))
        assert quota == 64 << 20 and directory.endswith(os.path.join("cache", "default", "ft.files"))
        assert oct(os.stat(directory).st_mode & 0o777) == "0o700"
        with fs.open("ft/small.bin") as f:  # one block: never copied, nothing to gain
            assert not isinstance(f, io.BufferedReader)
            f.read()

        new = os.urandom(4 * BS)  # a new version after a sync: its own file id, never the old file
        (src / "shard.bin").write_bytes(new)
        plane.sync("ft")
        client.namespace.reload()
        with fs.open("ft/shard.bin") as f:
            assert not isinstance(f, io.BufferedReader)
            assert f.read() == new
        fs.close()
        plane.delete("Dataset", "ft")
        assert not os.path.exists(directory)  # its versions go with the dataset
    finally:
        fs.close()
        plane.close()


def test_quota_zero_turns_the_file_tier_off(datacache_home, tmp_path):
    plane, _, data = _dataset(datacache_home, tmp_path, {"quota": 0})
    client = plane.open_dataset("ft")
    try:
        assert client.files is None
        warmup(client, ["shard.bin"])
        assert client.local_file(client.stat("shard.bin")) is None
        with client.open("shard.bin") as f:
            assert f.read() == data
    finally:
        client.close()
        plane.close()
