"""The moto S3 server serves a ranged GET by reading only its range (``datacache.demo.moto_ranges``).

Evidence that cannot come from stock moto: the bytes the server process read (``rchar`` of
``/proc/PID/io``: every ``read()`` it made, from the object's temporary file and its sockets)
while it answered ranged GETs of a 40 MiB object (past moto's own 5 MiB in-memory buffer, set
back for this test, so the key lives in a file). ``MotoServer(ranges="moto")``, the stock server,
reads the whole object for each request; the same count shows it, so the measure is real. The
Range semantics stay moto's (206 and Content-Range, a suffix range, 416 past the end, several
ranges answered whole). By default the server keeps objects in memory (last test).
"""

from __future__ import annotations

import hashlib
import os

import pytest
from botocore.exceptions import ClientError

from datacache.demo.s3server import DEFAULT_REGION, MotoServer

SIZE = 40 << 20
RANGE = 64 << 10
OFFSETS = [0, 7 << 20, 20 << 20, SIZE - RANGE, 123_457]


def _rchar(pid: int) -> int:
    """Bytes process ``pid`` has read with read()-like calls (files and sockets)."""
    with open(f"/proc/{pid}/io") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("rchar:"))


def _client(server: MotoServer):
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=server.endpoint_url, aws_access_key_id="testing",
                        aws_secret_access_key="testing", verify=False,
                        config=Config(region_name=DEFAULT_REGION, s3={"addressing_style": "path"},
                                      retries={"max_attempts": 1}))


@pytest.fixture(scope="module")
def data() -> bytes:
    return os.urandom(SIZE)


MOTO_BUFFER = (5 << 20) - 1024  # moto's own MOTO_S3_DEFAULT_KEY_BUFFER_SIZE: larger keys go to a file


def _ranged_reads(ranges: str, data: bytes) -> tuple[int, list[dict]]:
    """Start a server with ``ranges``, store ``data`` as one object, GET each range of
    ``OFFSETS``; returns (bytes the server read meanwhile, the responses)."""
    with MotoServer(ranges=ranges) as server:
        s3 = _client(server)
        s3.create_bucket(Bucket="ranged", CreateBucketConfiguration={"LocationConstraint": DEFAULT_REGION})
        s3.put_object(Bucket="ranged", Key="big.bin", Body=data)
        before = _rchar(server.pid)
        responses = []
        for off in OFFSETS:
            r = s3.get_object(Bucket="ranged", Key="big.bin", Range=f"bytes={off}-{off + RANGE - 1}")
            r["Data"] = r["Body"].read()
            responses.append(r)
        return _rchar(server.pid) - before, responses


def test_a_ranged_get_reads_only_its_range_stock_moto_reads_the_object(data, monkeypatch):
    monkeypatch.setenv("MOTO_S3_DEFAULT_KEY_BUFFER_SIZE", str(MOTO_BUFFER))
    read, responses = _ranged_reads("stored", data)
    for off, r in zip(OFFSETS, responses, strict=True):
        assert r["ResponseMetadata"]["HTTPStatusCode"] == 206
        assert r["ContentRange"] == f"bytes {off}-{off + RANGE - 1}/{SIZE}"
        assert r["Data"] == data[off:off + RANGE]
    wanted = len(OFFSETS) * RANGE
    # the ranges themselves, plus the requests' headers (a few KB each)
    assert wanted <= read < wanted + (256 << 10), read

    stock_read, stock = _ranged_reads("moto", data)
    assert [r["Data"] for r in stock] == [r["Data"] for r in responses]
    assert stock_read >= len(OFFSETS) * SIZE, stock_read  # the whole object for every range


def test_range_semantics_stay_moto_s(moto_server, data):
    assert moto_server.ranges == "stored"  # the tests' shared server serves ranges as S3 does
    s3 = _client(moto_server)
    s3.create_bucket(Bucket="semantics", CreateBucketConfiguration={"LocationConstraint": DEFAULT_REGION})
    small = data[:1000]
    s3.put_object(Bucket="semantics", Key="k", Body=small)
    try:
        r = s3.get_object(Bucket="semantics", Key="k", Range="bytes=-10")  # the last 10 bytes
        assert (r["ContentRange"], r["Body"].read()) == ("bytes 990-999/1000", small[-10:])
        r = s3.get_object(Bucket="semantics", Key="k", Range="bytes=995-")  # open end
        assert (r["ContentRange"], r["Body"].read()) == ("bytes 995-999/1000", small[995:])
        r = s3.get_object(Bucket="semantics", Key="k", Range="bytes=900-5000")  # clipped at the end
        assert (r["ContentLength"], r["Body"].read()) == (100, small[900:])
        r = s3.get_object(Bucket="semantics", Key="k", Range="bytes=0-1,5-6")  # several: the whole object
        assert r["ResponseMetadata"]["HTTPStatusCode"] == 200
        assert hashlib.sha256(r["Body"].read()).digest() == hashlib.sha256(small).digest()
        r = s3.get_object(Bucket="semantics", Key="k")  # no Range: unchanged
        assert r["Body"].read() == small
        with pytest.raises(ClientError) as err:
            s3.get_object(Bucket="semantics", Key="k", Range="bytes=1000-1001")
        assert err.value.response["Error"]["Code"] == "InvalidRange"
        assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 416
    finally:
        s3.delete_object(Bucket="semantics", Key="k")
        s3.delete_bucket(Bucket="semantics")


def test_an_unknown_ranges_mode_is_refused():
    with pytest.raises(ValueError, match="MotoServer ranges='nginx': use one of stored, moto"):
        MotoServer(ranges="nginx")


@pytest.mark.parametrize("buffer", [None, MOTO_BUFFER])
def test_objects_stay_in_the_servers_memory_unless_the_environment_says_otherwise(data, buffer, monkeypatch):
    """By default a 40 MiB object is kept in memory (``KEY_BUFFER_BYTES``): a GET reads no file, so
    dropping the page cache before a benchmark's cold read does not make the store read its disk.
    With moto's own buffer size in the environment the object lives in a file, read per GET."""
    if buffer is None:
        monkeypatch.delenv("MOTO_S3_DEFAULT_KEY_BUFFER_SIZE", raising=False)
    else:
        monkeypatch.setenv("MOTO_S3_DEFAULT_KEY_BUFFER_SIZE", str(buffer))
    with MotoServer() as server:
        s3 = _client(server)
        s3.create_bucket(Bucket="memory", CreateBucketConfiguration={"LocationConstraint": DEFAULT_REGION})
        s3.put_object(Bucket="memory", Key="big.bin", Body=data)
        before = _rchar(server.pid)
        body = s3.get_object(Bucket="memory", Key="big.bin")["Body"].read()
        read = _rchar(server.pid) - before
    assert hashlib.sha256(body).digest() == hashlib.sha256(data).digest()
    if buffer is None:
        assert read < 256 << 10, read  # the request's headers only
    else:
        assert read >= SIZE, read
