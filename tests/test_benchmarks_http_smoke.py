"""Smoke tests of the benchmarks' HTTP source, at tiny sizes (they measure nothing): nginx
(``benchmarks.nginx``: real byte ranges, ``If-Match``, index pages) and ``python -m benchmarks
--sources http`` with every installed system reading it through the delay proxy."""

from __future__ import annotations

import hashlib
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.common import cpu_seconds  # noqa: E402
from benchmarks.nginx import NginxServer, nginx_program  # noqa: E402
from benchmarks.proxy import DelayProxy  # noqa: E402
from test_benchmarks_smoke import TINY, check_tiny_report  # noqa: E402

pytestmark = pytest.mark.skipif(nginx_program() is None, reason="needs nginx (Debian: nginx)")


def _nginx_pids() -> set[int]:
    pids = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"datacache-nginx-" in f.read():
                    pids.add(int(pid))
        except OSError:
            pass
    return pids


def test_peer_benchmark_tiny_http_source_through_nginx(tmp_path):
    """The HTTP variant at tiny sizes: nginx behind the proxy; the local copy is parallel ranged
    GETs (its bytes are checked by sha256 against the generator's), datacache reads a Dataset
    whose mountPoint is the nginx URL, the peers are simplecache::http, blockcache::http and
    rclone's :http: backend (no s3fs-fuse: S3 only); nginx and its proxy are stopped at the end."""
    from benchmarks.__main__ import parse_args, run

    before = _nginx_pids()
    report = run(parse_args([*TINY, "--repeat", "1", "--sources", "http", "--out", str(tmp_path)]), lambda s: None)
    check_tiny_report(report, "http", 6)
    names = [o.system for o in report.outcomes]
    assert "fsspec simplecache::http" in names and "fsspec blockcache::http" in names
    assert not any(n.startswith("s3fs") for n in names)
    assert "| http | warmup / first copy (shard + Parquet) | datacache FUSE mount |" in report.text
    assert "nginx (nginx/1." in report.text and "ranged GETs" in report.text
    assert _nginx_pids() <= before  # nginx (master and worker) is gone


def test_nginx_serves_ranges_preconditions_and_index_pages(tmp_path):
    import urllib.error
    import urllib.request

    data = os.urandom(100_000)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.bin").write_bytes(data)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with NginxServer(str(tmp_path)) as web:
        pid = web.pid
        with opener.open(urllib.request.Request(web.url + "/d/x.bin", headers={"Range": "bytes=10-19"})) as r:
            assert r.status == 206 and r.read() == data[10:20]
            etag = r.headers["ETag"]
            assert r.headers["Content-Range"] == "bytes 10-19/100000"
        with opener.open(urllib.request.Request(web.url + "/d/x.bin", headers={"If-Match": etag})) as r:
            assert hashlib.sha256(r.read()).digest() == hashlib.sha256(data).digest()
        with pytest.raises(urllib.error.HTTPError) as err:
            opener.open(urllib.request.Request(web.url + "/d/x.bin", headers={"If-Match": '"other"'}))
        assert err.value.code == 412
        with opener.open(web.url + "/d/") as r:
            assert b'<a href="x.bin">x.bin</a>' in r.read()  # autoindex: what fsspec's HTTP lists
        work = web.work
    assert web.pid is None and not os.path.exists(work) and cpu_seconds(pid) is None  # reaped


def test_proxy_takes_responses_the_client_drops_as_normal(tmp_path):
    """Issue 8's hang: fsspec's HTTP ``exists`` GETs a file and drops the connection after the
    headers (``simplecache::`` does it before every download). The proxy logged a traceback for
    each into a stderr pipe nobody read; after ~60 the pipe was full and every request through the
    proxy waited forever. 300 such requests on a 4 MB file (a body that cannot be written before
    the client leaves), then a whole read: it answers, with the right bytes, and logs nothing;
    the child's output goes to a file, not a pipe."""
    import aiohttp
    import fsspec

    data = os.urandom(4_000_000)
    (tmp_path / "big.bin").write_bytes(data)
    with NginxServer(str(tmp_path)) as web, DelayProxy(web.url, latency_ms=0, bandwidth_mbps=100) as proxy:
        for fd in (1, 2):
            assert not os.readlink(f"/proc/{proxy.pid}/fd/{fd}").startswith("pipe:")
        # a client timeout: a proxy that stops answering fails the test instead of hanging it
        fs = fsspec.filesystem("http", skip_instance_cache=True,
                               client_kwargs={"timeout": aiohttp.ClientTimeout(total=20)})
        url = proxy.endpoint_url + "/big.bin"
        for _ in range(300):
            assert fs.exists(url)
        assert hashlib.sha256(fs.cat_file(url)).digest() == hashlib.sha256(data).digest()
        assert proxy.log_tail() == ""
