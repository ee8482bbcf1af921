"""Directories with no file below them (issue 19, item 18): an empty directory of a local source
(DLIO's empty ``valid/``), nested empty directories, and S3 directory markers (a zero-byte key
``m/`` alone, and ``d/`` beside ``d/x``) appear as directories in the FUSE mount, ``datacache ls``
and ``datacache://``, as Mountpoint for Amazon S3 shows markers; ``fileNum`` counts files only;
after they are deleted in the UFS a ``datacache sync`` counts and removes them."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys

import fsspec
import numpy as np
import pytest

from datacache.api.quantity import format_bytes

from fuse_support import S3_KEY, S3_SECRET, apply_dataset, force_cleanup, mount, sha256, wait_until

NAME = "fusedirs"


def datacache(home: str, *args: str) -> subprocess.CompletedProcess:
    """``python -m datacache ARGS --home HOME``, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "datacache", *args, "--home", home], capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def tree(fuse_available, fuse_moto, tmp_path):
    """``(home, mountpoint, local source, s3fs, bucket, files)`` of the dataset ``fusedirs``: a local
    mount at /local and an S3 mount at /s3, applied (synced) but not mounted."""
    rng = np.random.default_rng(19)
    home, mp, local = str(tmp_path / "home"), str(tmp_path / "mnt"), tmp_path / "local"
    os.makedirs(home, mode=0o700)
    os.makedirs(mp)
    files = {"local/train/a.bin": rng.bytes(70_000), "local/deep/f.txt": b"beside the empty ones\n",
             "s3/d/x": rng.bytes(5000), "s3/top.bin": rng.bytes(123)}
    for d in ("train", "valid", "deep/e1/e2"):
        (local / d).mkdir(parents=True)
    (local / "train" / "a.bin").write_bytes(files["local/train/a.bin"])
    (local / "deep" / "f.txt").write_bytes(files["local/deep/f.txt"])
    fs = fuse_moto.s3fs(key=S3_KEY, secret=S3_SECRET)
    bucket = f"fusedirs{os.getpid()}"
    fs.mkdir(bucket)
    # Markers as the S3 console and `aws s3api put-object --key m/` make them: zero-byte keys ending in '/'.
    fs.pipe({f"{bucket}/data/d/x": files["s3/d/x"], f"{bucket}/data/top.bin": files["s3/top.bin"]})
    for key in ("data/m/", "data/d/"):
        fs.call_s3("put_object", Bucket=bucket, Key=key, Body=b"")
    apply_dataset(home, NAME, fuse_moto.endpoint_url, bucket, str(local))
    yield home, mp, local, fs, bucket, files
    force_cleanup(home, mp)
    fs.rm(bucket, recursive=True)


def test_empty_directories_and_markers_show_in_the_mount_ls_and_fsspec_and_go_after_a_sync(tree):
    home, mp, local, fs, bucket, files = tree
    mount(type("Env", (), {"home": home, "name": NAME}), mp)

    # The FUSE mount.
    assert sorted(os.listdir(mp)) == ["local", "s3"]
    assert sorted(os.listdir(f"{mp}/local")) == ["deep", "train", "valid"]
    assert os.listdir(f"{mp}/local/valid") == []
    assert stat.S_ISDIR(os.stat(f"{mp}/local/valid").st_mode)
    assert sorted(os.listdir(f"{mp}/local/deep")) == ["e1", "f.txt"]
    assert os.listdir(f"{mp}/local/deep/e1") == ["e2"] and os.listdir(f"{mp}/local/deep/e1/e2") == []
    assert sorted(os.listdir(f"{mp}/s3")) == ["d", "m", "top.bin"]
    assert os.listdir(f"{mp}/s3/m") == [] and stat.S_ISDIR(os.stat(f"{mp}/s3/m").st_mode)
    assert os.listdir(f"{mp}/s3/d") == ["x"]  # the marker of a non-empty directory adds nothing
    for path, data in files.items():
        with open(f"{mp}/{path}", "rb") as f:
            assert sha256(f.read()) == sha256(data), path
    walked = sorted(os.path.relpath(os.path.join(r, d), mp) for r, ds, _ in os.walk(mp) for d in ds)
    assert walked == ["local", "local/deep", "local/deep/e1", "local/deep/e1/e2", "local/train", "local/valid",
                      "s3", "s3/d", "s3/m"]

    # `datacache ls`
    r = datacache(home, "ls", f"{NAME}/local")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["deep/", "train/", "valid/"]
    r = datacache(home, "ls", f"{NAME}/local/valid")
    assert (r.returncode, r.stdout) == (0, ""), r.stderr
    r = datacache(home, "ls", "-l", f"{NAME}/s3")
    assert r.returncode == 0, r.stderr
    assert [line.split()[-1] for line in r.stdout.splitlines()] == ["d/", "m/", "top.bin"]

    # datacache:// (fsspec)
    dfs = fsspec.filesystem("datacache", home=home, skip_instance_cache=True)
    try:
        assert dfs.ls(f"{NAME}/local/valid", detail=False) == []
        assert dfs.info(f"{NAME}/s3/m")["type"] == "directory"
        assert [(e["name"], e["type"]) for e in dfs.ls(f"{NAME}/s3")] == [
            (f"{NAME}/s3/d", "directory"), (f"{NAME}/s3/m", "directory"), (f"{NAME}/s3/top.bin", "file")]
        assert dfs.isdir(f"{NAME}/local/deep/e1/e2")
    finally:
        dfs.close()

    # Counted: files only.
    r = datacache(home, "get", "datasets", NAME, "-o", "json")
    assert r.returncode == 0, r.stderr
    status = json.loads(r.stdout)["status"]
    assert (status["fileNum"], status["ufsTotal"]) == (4, format_bytes(sum(map(len, files.values()))))

    # Gone after they are deleted in the UFS and synced: the sync counts each directory once.
    os.rmdir(local / "valid")
    shutil.rmtree(local / "deep" / "e1")
    fs.call_s3("delete_object", Bucket=bucket, Key="data/m/")
    r = datacache(home, "sync", NAME)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"dataset.datacache.io/{NAME} synced: 0 added, 0 changed, 3 deleted"
    wait_until(lambda: sorted(os.listdir(f"{mp}/local")) == ["deep", "train"], 10, "valid/ to leave the mount")
    assert os.listdir(f"{mp}/local/deep") == ["f.txt"] and sorted(os.listdir(f"{mp}/s3")) == ["d", "top.bin"]
    for gone in ("local/valid", "local/deep/e1", "s3/m"):
        with pytest.raises(FileNotFoundError):
            os.listdir(f"{mp}/{gone}")
    r = datacache(home, "ls", f"{NAME}/local")
    assert r.stdout.splitlines() == ["deep/", "train/"]
    assert datacache(home, "ls", f"{NAME}/local/valid").returncode != 0

    # ... and back, empty again: added as one directory, not as its files.
    (local / "valid").mkdir()
    r = datacache(home, "sync", NAME)
    assert r.stdout.strip() == f"dataset.datacache.io/{NAME} synced: 1 added, 0 changed, 0 deleted"
    wait_until(lambda: os.path.isdir(f"{mp}/local/valid"), 10, "valid/ to come back")
    assert os.listdir(f"{mp}/local/valid") == []
