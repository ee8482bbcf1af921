"""Cases C3, C4, C5: objects that change or vanish in the UFS under the cache (moto S3)."""

from __future__ import annotations

import errno
import os

import pytest

from datacache.errors import StaleFileError
from support import apply_dataset, s3_mount

MiB = 1 << 20


@pytest.fixture
def s3_dataset(datacache_home, s3_bucket, moto_server, moto_secrets):
    fs, bucket = s3_bucket

    def make(files: dict[str, bytes], block_size="1Mi"):
        fs.pipe({f"{bucket}/{k}": v for k, v in files.items()})
        plane = apply_dataset(datacache_home, "ver", [s3_mount(moto_server, bucket)], block_size=block_size)
        return plane, fs, bucket

    return make


def test_c3_overwritten_object_reads_old_version_until_sync_then_new(s3_dataset):
    old, new = os.urandom(5 * MiB + 123), os.urandom(3 * MiB + 7)
    plane, fs, bucket = s3_dataset({"obj.bin": old})
    client = plane.open_dataset("ver")
    assert client.open("obj.bin").read() == old  # now cached
    held = client.open("obj.bin")
    held.seek(MiB)
    fs.pipe(f"{bucket}/obj.bin", new)

    for _ in range(2):  # before a refresh: the old version, completely, every time
        assert client.open("obj.bin").read() == old
    diff = plane.sync("ver")
    assert diff.changed == ["obj.bin"] and not diff.added and not diff.deleted
    fresh = plane.open_dataset("ver")
    assert fresh.open("obj.bin").read() == new
    # A handle opened before the sync stays on its version: never bytes of both.
    assert held.read() == old[MiB:]
    fresh.close()
    client.close()


def test_c3_partially_cached_object_never_mixes_versions(s3_dataset):
    old, new = os.urandom(4 * MiB), os.urandom(4 * MiB)
    plane, fs, bucket = s3_dataset({"obj.bin": old})
    client = plane.open_dataset("ver")
    client.readahead = 0  # only block 0 gets cached
    with client.open("obj.bin") as f:
        assert f.read(1000) == old[:1000]
    assert [client.source.is_cached(client.stat("obj.bin"), i) for i in range(4)] == [True, False, False, False]
    fs.pipe(f"{bucket}/obj.bin", new)
    with client.open("obj.bin") as f:
        with pytest.raises(StaleFileError) as info:
            f.read()
    assert info.value.errno == errno.ESTALE
    assert "overwritten" in str(info.value)
    # The file's entry was refreshed: the next open reads the new version whole.
    assert client.open("obj.bin").read() == new
    client.close()


def test_c4_deleted_object_reads_from_cache_until_sync_then_enoent(s3_dataset):
    data, other = os.urandom(2 * MiB), os.urandom(3 * MiB)
    plane, fs, bucket = s3_dataset({"gone.bin": data, "uncached.bin": other})
    client = plane.open_dataset("ver")
    assert client.open("gone.bin").read() == data
    fs.rm(f"{bucket}/gone.bin")
    fs.rm(f"{bucket}/uncached.bin")
    assert client.open("gone.bin").read() == data  # still served from the cache
    with pytest.raises(FileNotFoundError) as info:  # a missing block: ENOENT, never EIO
        client.open("uncached.bin").read()
    assert info.value.errno == errno.ENOENT
    diff = plane.sync("ver")
    assert sorted(diff.deleted) == ["gone.bin", "uncached.bin"]
    client.close()
    client = plane.open_dataset("ver")
    for path in ("gone.bin", "uncached.bin"):
        with pytest.raises(FileNotFoundError):
            client.open(path)
    client.close()


def test_c5_object_shrunk_after_listing_gives_stale_error_then_new_content(s3_dataset):
    plane, fs, bucket = s3_dataset({"shrink.bin": os.urandom(200_000)}, block_size="64Ki")
    client = plane.open_dataset("ver")
    assert client.stat("shrink.bin").size == 200_000
    smaller = os.urandom(100_000)
    fs.pipe(f"{bucket}/shrink.bin", smaller)
    with client.open("shrink.bin") as f:
        f.seek(150_000)  # a range the new object does not even have
        with pytest.raises(StaleFileError) as info:
            f.read(10_000)
    assert info.value.errno == errno.ESTALE
    assert client.stat("shrink.bin").size == 100_000  # metadata of that file refreshed
    assert client.open("shrink.bin").read() == smaller
    client.close()


def test_per_file_refresh_does_not_revert_a_newer_sync(s3_dataset):
    plane, fs, bucket = s3_dataset({"a.bin": os.urandom(100_000)}, block_size="64Ki")
    long_lived = plane.open_dataset("ver")  # e.g. a FUSE daemon, opened before the sync
    fs.pipe(f"{bucket}/added.bin", b"new file")
    fs.pipe(f"{bucket}/a.bin", os.urandom(50_000))
    assert plane.sync("ver").added == ["added.bin"]
    with long_lived.open("a.bin") as f:  # its stale view hits the changed object
        with pytest.raises(StaleFileError):
            f.read()
    long_lived.close()
    client = plane.open_dataset("ver")
    assert sorted(e.path for e in client.manifest) == ["a.bin", "added.bin"]
    assert client.open("added.bin").read() == b"new file"
    client.close()


def test_folder_marker_objects_are_not_files(s3_dataset):
    plane, fs, bucket = s3_dataset({"train/": b"", "train/x.bin": b"xx"})
    client = plane.open_dataset("ver")
    assert [e.path for e in client.manifest] == ["train/x.bin"]
    assert sorted(client.listdir("train")) == ["x.bin"]
    client.close()
