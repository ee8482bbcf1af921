"""UFS names the namespace cannot hold as they are: non-UTF-8 local names, and S3 keys with empty,
'.' or '..' parts. Each is either canonicalised (and readable under that path) or skipped with a
warning that names the file and the fix; nothing else of the dataset is lost."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import boto3

from datacache.control.embedded import Embedded
from support import apply_dataset, dataset_yaml, s3_mount


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_non_utf8_local_name_is_skipped_with_a_warning_and_the_rest_applies(tmp_path, datacache_home):
    src = tmp_path / "src"
    src.mkdir()
    good = os.urandom(5000)
    (src / "ok.jpg").write_bytes(good)
    with open(os.path.join(os.fsencode(src), b"caf\xe9.jpg"), "wb") as f:  # Latin-1 bytes, not UTF-8
        f.write(b"latin-1 name")
    spec = tmp_path / "ds.yaml"
    spec.write_text(dataset_yaml("names", [{"name": "local", "mountPoint": str(src)}],
                                 [{"mediumtype": "SSD", "path": "cache", "quota": "64Mi"}]))
    proc = subprocess.run([sys.executable, "-m", "datacache", "apply", "-f", str(spec)], capture_output=True,
                          timeout=120, env={**os.environ, "DATACACHE_HOME": str(datacache_home)})
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert proc.stdout.decode().splitlines() == ["dataset.datacache.io/names created",
                                                 "cacheruntime.datacache.io/names created"]
    assert "Traceback" not in err
    assert (f"dataset 'names': spec.mounts[0] ('local'): skipped b'{src}/caf\\xe9.jpg': its name is not "
            "valid UTF-8 (rename it in the UFS to include it)") in err
    client = Embedded(str(datacache_home)).open_dataset("names")
    try:
        assert [e.path for e in client.manifest] == ["ok.jpg"]
        with client.open("ok.jpg") as f:
            assert sha(f.read()) == sha(good)
    finally:
        client.close()


def test_s3_keys_with_empty_dot_and_dotdot_parts(s3_bucket, moto_server, moto_secrets, datacache_home, caplog):
    _, bucket = s3_bucket
    contents = {"a//b.jpg": b"double slash", "/lead.jpg": b"leading slash", "x/./y.jpg": b"dot part",
                "plain.jpg": b"plain", "p/../q.jpg": b"dot-dot part"}
    # boto3 writes each key byte for byte (s3fs would clean the paths up first).
    s3 = boto3.client("s3", endpoint_url=moto_server.endpoint_url, aws_access_key_id="testing",
                      aws_secret_access_key="testing", region_name="us-east-1", verify=False)
    for key, data in contents.items():
        s3.put_object(Bucket=bucket, Key=key, Body=data)
    with caplog.at_level("WARNING", logger="datacache.ufs"):
        plane = apply_dataset(datacache_home, "keys", [s3_mount(moto_server, bucket)])
    assert [r.getMessage() for r in caplog.records] == [
        f"dataset 'keys': spec.mounts[0] ('s3'): skipped b'{bucket}/p/../q.jpg': its name has '..' parts "
        "(rename it in the UFS to include it)"]
    ds = plane.open_dataset("keys")
    try:
        expected = {"a/b.jpg": "a//b.jpg", "lead.jpg": "/lead.jpg", "x/y.jpg": "x/./y.jpg", "plain.jpg": "plain.jpg"}
        assert sorted(e.path for e in ds.manifest) == sorted(expected)
        for path, key in expected.items():
            with ds.open(path) as f:
                assert sha(f.read()) == sha(contents[key]), path
        assert list(ds.listdir("x")) == ["y.jpg"]
    finally:
        ds.close()
        for key in contents:  # the bucket fixture's s3fs clean-up cannot address '/lead.jpg'
            s3.delete_object(Bucket=bucket, Key=key)
