"""The demo dataset generator and the moto server, against a real moto process over HTTP."""

from __future__ import annotations

import io
import os
import re
import socket
import tarfile
import uuid

import fsspec
import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from datacache.demo.sample_data import (
    JPEG_MAX_BYTES,
    JPEG_MIN_BYTES,
    build_demo_dataset,
    class_ids,
    make_jpeg_tree,
    make_tar_shard,
    sha256_bytes,
    sha256_file,
)
from datacache.demo.s3server import MotoServer, MotoServerError

TINY = dict(n_jpeg=40, n_classes=5, n_parquet=2, parquet_rows=10_000, row_group_size=2_500,
            shard_bytes=8 << 20, seed=7)


@pytest.fixture(scope="module")
def tiny(moto_server, tmp_path_factory):
    """A tiny demo dataset in its own bucket: (s3fs, bucket, local_root, checksums)."""
    fs = moto_server.s3fs()
    bucket = f"demo-{uuid.uuid4().hex[:12]}"
    local_root = tmp_path_factory.mktemp("local")
    sums = build_demo_dataset(fs, bucket, local_root, **TINY)
    fs.invalidate_cache()
    yield fs, bucket, local_root, sums
    fs.rm(bucket, recursive=True)


def _s3_keys(sums, prefix="s3/"):
    return sorted(k for k in sums if k.startswith(prefix))


def test_every_file_is_listed(tiny):
    fs, bucket, local_root, sums = tiny
    listed = sorted("s3/" + p[len(bucket) + 1:] for p in fs.find(bucket))
    assert listed == _s3_keys(sums)
    local = sorted(
        "local/" + os.path.relpath(os.path.join(d, f), local_root).replace(os.sep, "/")
        for d, _, files in os.walk(local_root) for f in files
    )
    assert local == _s3_keys(sums, "local/")
    assert len(_s3_keys(sums, "s3/imagenet/")) == TINY["n_jpeg"]
    assert len(_s3_keys(sums, "s3/parquet/")) == TINY["n_parquet"]
    assert _s3_keys(sums, "s3/shards/") == ["s3/shards/shard-000000.tar"]
    assert {"local/labels.csv", "local/classes.txt", "local/README"} <= set(sums)


def test_imagenet_layout(tiny):
    _, _, local_root, sums = tiny
    classes = class_ids(TINY["n_classes"], TINY["seed"])
    pattern = re.compile(r"^s3/imagenet/train/(n\d{8})/\1_\d+\.JPEG$")
    seen = set()
    for key in _s3_keys(sums, "s3/imagenet/"):
        m = pattern.match(key)
        assert m, key
        seen.add(m.group(1))
    assert seen == set(classes)
    assert (local_root / "classes.txt").read_text().split() == classes
    splits = (local_root / "splits" / "train.txt").read_text().split()
    splits += (local_root / "splits" / "val.txt").read_text().split()
    assert sorted("s3/imagenet/" + p for p in splits) == _s3_keys(sums, "s3/imagenet/")


def test_jpegs_decode_and_sizes_spread(tiny):
    fs, bucket, _, sums = tiny
    paths = [f"{bucket}/{k[3:]}" for k in _s3_keys(sums, "s3/imagenet/")]
    blobs = fs.cat(paths)
    sizes = []
    for path, data in blobs.items():
        assert JPEG_MIN_BYTES <= len(data) <= JPEG_MAX_BYTES, (path, len(data))
        with Image.open(io.BytesIO(data)) as img:
            assert img.format == "JPEG"
            img.load()
            assert img.mode == "RGB" and min(img.size) >= 16
        sizes.append(len(data))
    # Spread over the range, not clustered: every third of the log range is populated.
    edges = np.geomspace(JPEG_MIN_BYTES, JPEG_MAX_BYTES, 4)
    counts, _ = np.histogram(sizes, bins=edges)
    assert all(c >= 3 for c in counts), counts


def test_parquet_row_groups(tiny):
    fs, bucket, _, sums = tiny
    ids = []
    for key in _s3_keys(sums, "s3/parquet/"):
        with fs.open(f"{bucket}/{key[3:]}", "rb") as f:
            pf = pq.ParquetFile(f)
            md = pf.metadata
            assert md.num_rows == TINY["parquet_rows"]
            assert md.num_row_groups == TINY["parquet_rows"] // TINY["row_group_size"]
            assert all(md.row_group(i).num_rows == TINY["row_group_size"] for i in range(md.num_row_groups))
            table = pf.read()
        assert {"id", "label", "label_name", "caption", "score"} <= set(table.column_names)
        assert str(table.schema.field("caption").type) == "string"
        assert str(table.schema.field("score").type) == "float"
        assert str(table.schema.field("id").type) == "int64"
        assert table.column("label").to_numpy().max() < TINY["n_classes"]
        ids.extend(table.column("id").to_pylist())
    assert len(ids) == len(set(ids))


def test_tar_shard_walks_and_members_pair_up(tiny):
    fs, bucket, _, sums = tiny
    path = f"{bucket}/shards/shard-000000.tar"
    assert fs.info(path)["size"] >= TINY["shard_bytes"]
    names = []
    with fs.open(path, "rb") as f, tarfile.open(fileobj=f, mode="r|") as tar:
        for member in tar:
            assert member.isfile()
            data = tar.extractfile(member).read()
            assert len(data) == member.size
            names.append(member.name)
            if member.name.endswith(".cls"):
                assert 0 <= int(data) < TINY["n_classes"]
            else:
                with Image.open(io.BytesIO(data)) as img:
                    img.load()
    assert len(names) % 2 == 0 and len(names) >= 2 * 20
    for i in range(0, len(names), 2):
        key = f"sample{i // 2:06d}"
        assert names[i:i + 2] == [f"{key}.jpg", f"{key}.cls"]


def test_checksums_equal_downloaded_bytes(tiny):
    fs, bucket, local_root, sums = tiny
    s3_keys = _s3_keys(sums)
    small = [k for k in s3_keys if not k.endswith(".tar")]
    blobs = fs.cat([f"{bucket}/{k[3:]}" for k in small])
    for key in small:
        assert sha256_bytes(blobs[f"{bucket}/{key[3:]}"]) == sums[key], key
    shard = "s3/shards/shard-000000.tar"
    assert sha256_file(f"{bucket}/{shard[3:]}", fs=fs) == sums[shard]
    for key in _s3_keys(sums, "local/"):
        assert sha256_file(local_root / key[len("local/"):]) == sums[key], key


def test_generation_is_deterministic(tmp_path, s3_bucket):
    fs, bucket = s3_bucket
    a, b, c = {}, {}, {}
    make_jpeg_tree(fs, f"{bucket}/a", n_files=6, n_classes=2, seed=3, checksums=a)
    make_jpeg_tree(None, str(tmp_path / "b"), n_files=6, n_classes=2, seed=3, checksums=b)
    make_jpeg_tree(None, str(tmp_path / "c"), n_files=6, n_classes=2, seed=4, checksums=c)
    rel = lambda d, root: {k[len(root):]: v for k, v in d.items()}  # noqa: E731
    assert rel(a, f"{bucket}/a") == rel(b, str(tmp_path / "b"))
    assert set(rel(a, f"{bucket}/a").values()).isdisjoint(c.values())
    for path, digest in b.items():  # local files were written as hashed
        assert sha256_file(path) == digest
    s1, s2 = {}, {}
    make_tar_shard(None, str(tmp_path / "s1.tar"), 1 << 20, seed=1, checksums=s1)
    make_tar_shard(fs, f"{bucket}/s2.tar", 1 << 20, seed=1, checksums=s2)
    assert list(s1.values()) == list(s2.values())
    assert sha256_file(f"{bucket}/s2.tar", fs=fs) == s2[f"{bucket}/s2.tar"]


@pytest.mark.parametrize("ca_bundle", ["machine", "/nonexistent/ca.pem"])
def test_storage_options_work_through_fsspec(moto_server, s3_bucket, monkeypatch, ca_bundle):
    # Plain-HTTP loopback must work whatever AWS_CA_BUNDLE says (these machines set one).
    if ca_bundle != "machine":
        monkeypatch.setenv("AWS_CA_BUNDLE", ca_bundle)
    _, bucket = s3_bucket
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **moto_server.storage_options())
    fs.pipe_file(f"{bucket}/x/y.bin", b"payload")
    with fsspec.open(f"s3://{bucket}/x/y.bin", "rb", **moto_server.storage_options()) as f:
        assert f.read() == b"payload"


def test_moto_server_process_is_reaped():
    with MotoServer() as server:
        pid = server.pid
        assert server.running and os.path.exists(f"/proc/{pid}")
        server.s3fs().mkdir("lifecycle-bucket")
    assert not server.running
    assert not os.path.exists(f"/proc/{pid}")  # reaped, not a zombie
    server.stop()  # idempotent

    with pytest.raises(RuntimeError, match="boom"):
        with MotoServer() as server:
            pid = server.pid
            raise RuntimeError("boom")
    assert not os.path.exists(f"/proc/{pid}")


def test_moto_server_start_failure_is_explained():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = MotoServer(port=taken.getsockname()[1], start_timeout=10)
        with pytest.raises(MotoServerError, match="(?i)in use"):
            server.start()
    assert not server.running
