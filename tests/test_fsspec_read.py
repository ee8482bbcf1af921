"""``datacache://`` whole-file and range reads (``cat_file``, no file object): the byte ranges
fsspec defines, errors for directories and missing paths, and a version that changed under the
cache (case C5) through this path."""

from __future__ import annotations

import errno
import os

import fsspec
import pytest

from datacache.errors import StaleFileError
from support import apply_dataset, s3_mount

BLOCK = 64 << 10


@pytest.fixture
def ranged(datacache_home, tmp_path):
    """``(fs, {name: bytes})``: a one-block file, a three-block file and a directory, 64 KiB blocks."""
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    files = {"one.bin": os.urandom(BLOCK - 7), "three.bin": os.urandom(3 * BLOCK - 11)}
    for name, value in files.items():
        (src / name).write_bytes(value)
    (src / "sub" / "x.bin").write_bytes(b"x")
    plane = apply_dataset(datacache_home, "rng", [{"name": "local", "mountPoint": str(src)}], block_size="64Ki")
    fs = fsspec.filesystem("datacache", home=str(plane.home), skip_instance_cache=True)
    yield fs, files
    fs.close()
    plane.close()


@pytest.mark.parametrize("start, end", [
    (None, None), (0, 10), (10, None), (-100, None), (-100, -10), (BLOCK - 50, BLOCK + 50),
    (BLOCK, 2 * BLOCK), (5, 3 * BLOCK + 100), (10**9, None), (20, 10),
])
def test_cat_file_ranges_match_the_source(ranged, start, end):
    fs, files = ranged
    for _ in range(2):  # a fill from the UFS, then hits from the SSD tier
        for name, value in files.items():
            assert fs.cat_file(f"rng/{name}", start=start, end=end) == value[start:end], (name, start, end)


def test_cat_file_of_a_directory_or_missing_path(ranged):
    fs, _ = ranged
    with pytest.raises(IsADirectoryError) as info:
        fs.cat_file("rng/sub")
    assert info.value.errno == errno.EISDIR
    with pytest.raises(FileNotFoundError) as info:
        fs.cat_file("rng/nope.bin")
    assert info.value.errno == errno.ENOENT
    with pytest.raises(FileNotFoundError):
        fs.cat_file("rng/../etc/passwd")


def test_c5_cat_file_of_a_changed_object_is_stale_then_reads_the_new_one(datacache_home, s3_bucket, moto_server,
                                                                          moto_secrets):
    s3, bucket = s3_bucket
    s3.pipe(f"{bucket}/small.jpg", os.urandom(50_000))
    plane = apply_dataset(datacache_home, "ver", [s3_mount(moto_server, bucket)], block_size="64Ki")
    fs = fsspec.filesystem("datacache", home=str(plane.home), skip_instance_cache=True)
    try:
        assert fs.info("ver/small.jpg")["size"] == 50_000
        new = os.urandom(30_000)
        s3.pipe(f"{bucket}/small.jpg", new)  # changed after the listing, never cached
        with pytest.raises(StaleFileError) as info:
            fs.cat_file("ver/small.jpg")
        assert info.value.errno == errno.ESTALE
        assert fs.info("ver/small.jpg")["size"] == 30_000  # that file's metadata was refreshed
        assert fs.cat_file("ver/small.jpg") == new
    finally:
        fs.close()
        plane.close()
