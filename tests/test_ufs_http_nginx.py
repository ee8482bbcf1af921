"""An HTTP source (``mountPoint: http://...``) served by a real nginx (Debian) with range support.

The namespace lists nginx's index pages, takes each file's size, mtime (``Last-Modified``) and
version (``ETag``; ``size:Last-Modified`` from a server that sends no ETag), reads exact byte
ranges, and refuses to return bytes of a file that changed since it was listed (StaleFileError);
end to end, ``datacache warmup`` caches the files and ``datacache://`` reads them back.
"""

from __future__ import annotations

import hashlib
import os
import sys

import pytest

from datacache.api.loader import load_resources
from datacache.errors import StaleFileError
from datacache.ufs.mounts import UnionNamespace
from support import apply_dataset, dataset_yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.nginx import NginxServer, nginx_program  # noqa: E402

pytestmark = pytest.mark.skipif(nginx_program() is None, reason="needs nginx (Debian: nginx)")

MTIME = 1_700_000_000  # seconds: a whole second (Last-Modified has 1 s resolution)


def _tree(root) -> dict[str, bytes]:
    files = {"a.bin": os.urandom(300_000), "sub/b.bin": os.urandom(70_001), "sub/deeper/c.txt": b"hello"}
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.utime(path, (MTIME, MTIME))
    return files


def _namespace(tmp_path, url: str) -> UnionNamespace:
    spec = tmp_path / "web.yaml"
    spec.write_text(dataset_yaml("web", [{"name": "web", "mountPoint": url + "/", "path": "/web"}],
                                 [{"mediumtype": "SSD", "path": "cache", "quota": "64Mi"}]))
    dataset = next(r for r in load_resources(str(spec)) if r.kind == "Dataset")
    return UnionNamespace(dataset, str(tmp_path / "home"))


def test_http_mount_lists_versions_and_reads_exact_ranges(tmp_path):
    src = tmp_path / "src"
    files = _tree(src)
    with NginxServer(str(src)) as web:
        ns = _namespace(tmp_path, web.url)
        listed = list(ns.list_files())
        entries = {e.path: e for e in listed if not e.path.endswith("/")}
        assert sorted(entries) == ["web/a.bin", "web/sub/b.bin", "web/sub/deeper/c.txt"]
        # Directories come too (the sync keeps only those with nothing below them).
        assert sorted(e.path for e in listed if e.path.endswith("/")) == ["web/", "web/sub/", "web/sub/deeper/"]
        for rel, data in files.items():
            e = entries[f"web/{rel}"]
            assert e.size == len(data)
            assert e.mtime == MTIME
            # nginx's ETag: "<mtime hex>-<size hex>"
            assert e.version == f'"{MTIME:x}-{len(data):x}"'
            assert ns.read("web", e.ufs_path, e.version, 1000 % len(data), len(data)) == data[1000 % len(data):]
        a = entries["web/a.bin"]
        assert ns.read("web", a.ufs_path, a.version, 123_456, 223_456) == files["a.bin"][123_456:223_456]

        (src / "a.bin").write_bytes(os.urandom(300_000))  # same size, new mtime: a new version
        with pytest.raises(StaleFileError, match="changed in the UFS"):
            ns.read("web", a.ufs_path, a.version, 0, 4096)
        assert ns.stat("web", a.ufs_path).version != a.version


def test_http_read_of_a_deleted_file_is_enoent_and_a_server_without_ranges_is_sliced(tmp_path):
    import subprocess
    import time
    import urllib.request

    src = tmp_path / "src"
    files = _tree(src)
    with NginxServer(str(src)) as web:
        ns = _namespace(tmp_path, web.url)
        b = next(e for e in ns.list_files() if e.path == "web/sub/b.bin")
        (src / "sub" / "b.bin").unlink()
        with pytest.raises(FileNotFoundError) as err:
            ns.read("web", b.ufs_path, b.version, 0, 10)
        assert err.value.errno == 2
    # Python's http.server answers every GET with the whole file (200, no Range support).
    from benchmarks.nginx import _free_port

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                             "--directory", str(src)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 10
        while True:
            try:
                urllib.request.urlopen(url + "/a.bin", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        (tmp_path / "plain").mkdir()
        ns = _namespace(tmp_path / "plain", url)
        a = next(e for e in ns.list_files() if e.path == "web/a.bin")
        assert ns.read("web", a.ufs_path, a.version, 1000, 5000) == files["a.bin"][1000:5000]
    finally:
        proc.terminate()
        proc.wait(10)


def test_http_server_without_etag_versions_by_size_and_last_modified(tmp_path):
    src = tmp_path / "src"
    files = _tree(src)
    with NginxServer(str(src), etag=False) as web:
        ns = _namespace(tmp_path, web.url)
        a = next(e for e in ns.list_files() if e.path == "web/a.bin")
        assert a.version == "300000:Tue, 14 Nov 2023 22:13:20 GMT" and a.mtime == MTIME
        assert ns.read("web", a.ufs_path, a.version, 0, 10) == files["a.bin"][:10]
        (src / "a.bin").write_bytes(os.urandom(300_000))  # same size: only Last-Modified tells
        os.utime(src / "a.bin", (MTIME + 60, MTIME + 60))
        with pytest.raises(StaleFileError):
            ns.read("web", a.ufs_path, a.version, 0, 10)


def test_http_without_etag_file_rewritten_while_sent_is_stale(tmp_path, monkeypatch):
    """Issue 18: size and Last-Modified are checked again after the body (a HEAD), so a file
    rewritten in place while its bytes were on their way is never returned (or cached) whole."""
    from datacache.ufs import versions

    src = tmp_path / "src"
    files = _tree(src)
    with NginxServer(str(src), etag=False) as web:
        ns = _namespace(tmp_path, web.url)
        a = next(e for e in ns.list_files() if e.path == "web/a.bin")
        assert ns.read("web", a.ufs_path, a.version, 0, 300_000) == files["a.bin"]
        real_info = versions._http_info

        def rewrite_after_the_get_headers(headers, size=None):
            info = real_info(headers, size)
            if size is not None:  # the GET's headers are checked: now the file changes in place
                with open(src / "a.bin", "r+b") as f:
                    f.write(os.urandom(300_000))
                os.utime(src / "a.bin", (MTIME + 60, MTIME + 60))
            return info

        monkeypatch.setattr(versions, "_http_info", rewrite_after_the_get_headers)
        with pytest.raises(StaleFileError, match="changed in the UFS while it was read"):
            ns.read("web", a.ufs_path, a.version, 0, 300_000)


def test_http_dataset_warmup_then_datacache_fsspec_reads_every_byte(tmp_path, datacache_home):
    import fsspec

    src = tmp_path / "src"
    files = _tree(src)
    with NginxServer(str(src)) as web:
        plane = apply_dataset(datacache_home, "web", [{"name": "web", "mountPoint": web.url + "/", "path": "/web"}],
                              block_size="64Ki")
        try:
            _, result = plane.warmup("web", ["web"])
        finally:
            plane.close()
        assert result.ok and sum(t.files for t in result.targets) == 3
        assert sum(t.bytes for t in result.targets) == sum(len(d) for d in files.values())
    # nginx is gone: these reads come from the cache
    fs = fsspec.filesystem("datacache", home=str(datacache_home), skip_instance_cache=True)
    for rel, data in files.items():
        assert hashlib.sha256(fs.cat_file(f"web/web/{rel}")).digest() == hashlib.sha256(data).digest()


def test_http_listing_runs_its_round_trips_in_parallel(tmp_path):
    """An index page gives names only, so each file's size and version take a HEAD, and each
    directory a GET of its page: behind a 0.3 s store, the 24 subdirectories' pages and 48 HEADs of
    this tree take at least 21.6 s one after another, a few rounds with ``LIST_CONCURRENCY`` in
    flight."""
    import time

    from benchmarks.proxy import DelayProxy
    from datacache.ufs.listing import LIST_CONCURRENCY

    src = tmp_path / "src"
    sizes = {f"f{i:02d}.bin": 1000 + i for i in range(24)}  # one directory of many files ...
    sizes.update({f"d{i:02d}/x.bin": 2000 + i for i in range(23)})  # ... and many of one file
    sizes["d00/deeper/y.bin"] = 3000
    for name, size in sizes.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(os.urandom(size))
    with NginxServer(str(src)) as web, DelayProxy(web.url, latency_ms=300, bandwidth_mbps=0) as slow:
        ns = _namespace(tmp_path, slow.endpoint_url)
        t0 = time.monotonic()
        listed = list(ns.list_files())
        seconds = time.monotonic() - t0
    files = [e for e in listed if not e.path.endswith("/")]
    assert {e.path: e.size for e in files} == {f"web/{n}": s for n, s in sizes.items()}
    assert all(e.version.startswith('"') for e in files)  # nginx's ETag, from each file's HEAD
    assert sorted(e.path for e in listed if e.path.endswith("/")) == sorted(
        ["web/", "web/d00/deeper/"] + [f"web/d{i:02d}/" for i in range(23)])
    serial = (24 + len(sizes)) * 0.3
    assert LIST_CONCURRENCY >= 8 and seconds < serial / 3, f"{seconds:.1f} s: the requests ran one after another"
