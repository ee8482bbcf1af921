"""C3, C4, C5 in one metadata sync through the API, against moto's S3 server over HTTP: a changed
object gets a new version (new block keys, new bytes), a deleted one leaves the namespace, an added
one appears; the diff, its file and the Dataset status say so."""

from __future__ import annotations

import errno
import hashlib
import os

import pyarrow.parquet as pq
import pytest

from datacache.control.sync import DIFF_FILE
from support import apply_dataset, s3_mount

MiB = 1 << 20


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_one_sync_sees_changed_deleted_and_added_objects(datacache_home, s3_bucket, moto_server, moto_secrets):
    fs, bucket = s3_bucket
    files = {"train/a.bin": os.urandom(2 * MiB + 5), "train/b.bin": os.urandom(300_000),
             "train/keep.bin": os.urandom(1000)}
    fs.pipe({f"{bucket}/{k}": v for k, v in files.items()})
    plane = apply_dataset(datacache_home, "c345", [s3_mount(moto_server, bucket)], block_size="1Mi")
    client = plane.open_dataset("c345")
    for path in ("train/a.bin", "train/b.bin"):
        assert sha(client.open(path).read()) == sha(files[path])  # cached
    old_a = client.stat("train/a.bin")

    new_a, added = os.urandom(MiB + 17), os.urandom(4321)  # another length (C5 shape: shrunk)
    fs.pipe(f"{bucket}/train/a.bin", new_a)
    fs.rm(f"{bucket}/train/b.bin")
    fs.pipe(f"{bucket}/train/sub/new.bin", added)
    # Before the sync: the snapshot's versions, from the cache (C3, C4).
    assert sha(client.open("train/a.bin").read()) == sha(files["train/a.bin"])
    assert sha(client.open("train/b.bin").read()) == sha(files["train/b.bin"])
    assert "sub" not in client.listdir("train")

    diff = plane.sync("c345")
    assert (diff.added, diff.changed, diff.deleted) == (["train/sub/new.bin"], ["train/a.bin"], ["train/b.bin"])
    rows = pq.read_table(os.path.join(plane._dataset_dir(plane.get("Dataset", "c345")), DIFF_FILE)).to_pylist()
    assert sorted((r["change"], r["path"]) for r in rows) == [
        ("added", "train/sub/new.bin"), ("changed", "train/a.bin"), ("deleted", "train/b.bin")]
    client.close()

    client = plane.open_dataset("c345")
    a = client.stat("train/a.bin")
    assert a.version == fs.info(f"{bucket}/train/a.bin")["ETag"] != old_a.version
    assert a.size == len(new_a)
    assert not client.source.is_cached(a, 0)  # new version, new block keys: the old blocks never serve it
    assert sha(client.open("train/a.bin").read()) == sha(new_a)
    assert sha(client.open("train/sub/new.bin").read()) == sha(added)
    with pytest.raises(FileNotFoundError) as info:
        client.open("train/b.bin")
    assert info.value.errno == errno.ENOENT
    assert sorted(client.listdir("train")) == ["a.bin", "keep.bin", "sub"]
    client.close()

    status = plane.list("Dataset")[0]["status"]
    assert status["fileNum"] == 3
    manifest = plane.load_manifest(plane.get("Dataset", "c345"))
    assert manifest.total_size == len(new_a) + len(added) + len(files["train/keep.bin"])
