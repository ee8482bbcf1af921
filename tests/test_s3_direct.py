"""Block reads of S3 mounts through obstore (:mod:`datacache.ufs.s3_direct`), on moto's server:
the same bytes as botocore's path, one version only (If-Match), credentials from the mount's
options or from botocore's chain, a one-line error, and the mounts obstore cannot express exactly
(requester pays, no endpoint and no region) kept on botocore."""

from __future__ import annotations

import errno
import hashlib
import os

import pytest
import s3fs

from datacache.errors import StaleFileError, UFSUnavailableError
from datacache.ufs import s3_direct
from datacache.ufs.versions import read_exact, version_of

MiB = 1 << 20


def _fs(moto_server, **options) -> s3fs.S3FileSystem:
    return s3fs.S3FileSystem(skip_instance_cache=True, client_kwargs={"endpoint_url": moto_server.endpoint_url},
                             config_kwargs={"connect_timeout": 5.0, "read_timeout": 10.0,
                                            "retries": {"total_max_attempts": 1}}, **options)


@pytest.fixture
def stored(s3_bucket):
    """``(path, bytes, etag)`` of a 3 MiB object in a fresh bucket."""
    fs, bucket = s3_bucket
    data = os.urandom(3 * MiB)
    path = f"{bucket}/obj.bin"
    fs.pipe(path, data)
    return path, data, version_of(fs, fs.info(path))


def test_ranged_reads_through_obstore_match_the_object_and_botocores_path(moto_server, stored):
    path, data, etag = stored
    fast = _fs(moto_server, key="testing", secret="testing")
    assert s3_direct.store_for(fast, path.split("/")[0]) is not None
    slow = _fs(moto_server, key="testing", secret="testing", requester_pays=True)
    assert s3_direct.store_for(slow, path.split("/")[0]) is None  # an option obstore does not express
    for start, end in ((0, MiB), (MiB - 7, 2 * MiB + 13), (2 * MiB, 3 * MiB + 99)):
        got = read_exact(fast, path, etag, start, end)
        assert hashlib.sha256(got).hexdigest() == hashlib.sha256(data[start:end]).hexdigest()
        assert bytes(read_exact(slow, path, etag, start, end)) == bytes(got)
    assert bytes(read_exact(fast, path, etag, 5, 5)) == b""


def test_an_overwritten_or_deleted_object_is_stale_or_gone_not_mixed(moto_server, s3_bucket, stored):
    fs, _ = s3_bucket
    path, _, etag = stored
    fast = _fs(moto_server, key="testing", secret="testing")
    fs.pipe(path, os.urandom(3 * MiB))
    with pytest.raises(StaleFileError, match="ETag changed"):
        read_exact(fast, path, etag, 0, MiB)
    fs.rm(path)
    with pytest.raises(FileNotFoundError) as err:
        read_exact(fast, path, etag, 0, MiB)
    assert err.value.errno == errno.ENOENT and err.value.filename == path


def test_credentials_come_from_botocores_chain_when_the_mount_names_none(moto_server, stored, monkeypatch,
                                                                        tmp_path):
    path, data, etag = stored
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.aws files
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    fs = _fs(moto_server)
    assert s3_direct.store_for(fs, path.split("/")[0]) is not None
    assert bytes(read_exact(fs, path, etag, MiB, 2 * MiB)) == data[MiB:2 * MiB]


def test_a_failing_endpoint_is_one_line_naming_the_object_and_no_secret(stored):
    path, _, etag = stored
    fs = s3fs.S3FileSystem(skip_instance_cache=True, key="AKIAEXAMPLE", secret="never-shown-secret",
                           client_kwargs={"endpoint_url": "http://127.0.0.1:9"},
                           config_kwargs={"connect_timeout": 1.0, "read_timeout": 1.0})
    with pytest.raises(UFSUnavailableError) as err:
        read_exact(fs, path, etag, 0, MiB)
    text = str(err.value)
    assert "http://127.0.0.1:9/" in text and path in text
    assert "\n" not in text and "never-shown-secret" not in text and "Debug source" not in text


def test_no_endpoint_and_no_region_stays_with_botocore(monkeypatch):
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    fs = s3fs.S3FileSystem(skip_instance_cache=True, key="a", secret="b")
    assert s3_direct.store_for(fs, "bucket") is None
    fs = s3fs.S3FileSystem(skip_instance_cache=True, key="a", secret="b", client_kwargs={"region_name": "eu-west-1"})
    assert s3_direct.store_for(fs, "bucket") is not None


def test_no_credentials_anywhere_is_one_line_naming_the_object_and_the_fix(moto_server, stored, monkeypatch,
                                                                          tmp_path):
    """A mount with no keys, and botocore's chain finding none either (no variables, no ~/.aws
    files, no instance metadata): the read fails with what to set, not a traceback from obstore's
    credential callback."""
    path, _, etag = stored
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name in ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_SECURITY_TOKEN", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE",
                 "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                 "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    fs = _fs(moto_server)
    assert s3_direct.store_for(fs, path.split("/")[0]) is not None
    with pytest.raises(UFSUnavailableError) as err:
        read_exact(fs, path, etag, 0, MiB)
    text = str(err.value)
    assert path in text and "no AWS credentials found (set the mount's secrets or AWS_* variables)" in text
    assert "\n" not in text and "Traceback" not in text
