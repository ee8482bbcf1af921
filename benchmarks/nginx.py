"""nginx (Debian's) as an HTTP source with real range support, on loopback, for benchmarks and tests.

``NginxServer(root)`` serves the files under ``root`` read-only on ``127.0.0.1`` from a generated
configuration in a temporary directory of its own (pid file, logs and temp paths all there, so it
runs without root and touches nothing of the system's nginx)::

    with NginxServer("/data/tree") as web:
        fs = fsspec.filesystem("http")
        fs.cat_file(web.url + "/a/b.bin", start=10, end=20)   # a real ranged GET (206)

What the configuration gives, and why: ``autoindex`` (HTML index pages: fsspec's
``HTTPFileSystem`` lists a directory by reading the links of its index page), static files with
``ETag`` / ``Last-Modified`` (nginx derives both from the file's mtime and size: the version a
Dataset's manifest keeps), byte ranges (206 answers to ``Range``), ``If-Match`` /
``If-Unmodified-Since`` preconditions (412 when the file changed), ``sendfile``, no access log
(it would cost disk writes per request), keep-alive for up to 100,000 requests per connection.

Process model: ``nginx -g 'daemon off;'`` in the foreground as our child (``master_process on``
with one worker), so ``stop()`` terminates and reaps it; run as root, the worker keeps the
caller's user (``user`` directive) so that it can read a 0700 directory. Port: nginx cannot report
a port it chose, so a free one is taken from the kernel (bind to port 0, close) and nginx is
started on it; if another process takes it in between, nginx exits ("Address already in use")
and a new port is tried (5 tries). Raises ``NginxError`` when nginx is not installed or does not
start (its error log's tail in the message).
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

__all__ = ["NginxError", "NginxServer", "nginx_program"]

CONFIG = """\
{user}worker_processes 1;
pid {work}/nginx.pid;
error_log {work}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    types {{ text/html html; application/octet-stream bin tar parquet; image/jpeg jpg jpeg JPEG; }}
    default_type application/octet-stream;
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 100000;
    keepalive_timeout 120s;
    client_body_temp_path {work}/body;
    proxy_temp_path {work}/proxy;
    fastcgi_temp_path {work}/fastcgi;
    uwsgi_temp_path {work}/uwsgi;
    scgi_temp_path {work}/scgi;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        location / {{
            autoindex on;
            autoindex_exact_size on;
            etag {etag};
        }}
    }}
}}
"""


class NginxError(RuntimeError):
    """nginx is not installed or did not start."""


def nginx_program() -> str | None:
    """Path of the nginx executable (``$PATH``, then Debian's ``/usr/sbin/nginx``), or None."""
    found = shutil.which("nginx")
    if found:
        return found
    return "/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NginxServer:
    """nginx serving ``root`` (a directory) on loopback; a context manager (see module doc).
    ``url``: ``http://127.0.0.1:PORT`` (no trailing slash); ``pid``: the master's pid while it runs.
    ``etag=False``: no ``ETag`` headers (``Last-Modified`` only: a server that gives no ETag)."""

    def __init__(self, root: str, start_timeout: float = 20.0, etag: bool = True):
        self.root = os.path.abspath(root)
        self.etag = etag
        self.start_timeout = start_timeout
        self.port: int | None = None
        self.work = ""
        self._proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise NginxError("nginx is not running")
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def __enter__(self) -> NginxServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> NginxServer:
        """Start nginx; returns self. Raises NginxError (see module doc)."""
        program = nginx_program()
        if program is None:
            raise NginxError("nginx is not installed (Debian: apt-get install nginx)")
        if not os.path.isdir(self.root):
            raise NginxError(f"nginx root {self.root!r} is not a directory")
        self.work = tempfile.mkdtemp(prefix="datacache-nginx-")
        user = ""
        if os.geteuid() == 0:  # the worker would switch to "nobody", which cannot read 0700 directories
            user = f"user {pwd.getpwuid(os.geteuid()).pw_name} {grp.getgrgid(os.getegid()).gr_name};\n"
        conf = os.path.join(self.work, "nginx.conf")
        last = ""
        for _ in range(5):
            port = _free_port()
            with open(conf, "w") as f:
                f.write(CONFIG.format(user=user, work=self.work, port=port, root=self.root,
                                      etag="on" if self.etag else "off"))
            log = open(os.path.join(self.work, "stderr.log"), "wb")
            try:
                # -e: the error log before the configuration is read (the default path needs root)
                self._proc = subprocess.Popen([program, "-p", self.work, "-c", conf, "-e", os.path.join(self.work, "error.log"),
                                               "-g", "daemon off;"], stdin=subprocess.DEVNULL, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True)
            finally:
                log.close()
            if self._await(port):
                self.port = port
                return self
            last = self._log_tail()
            self._reap()
            if "in use" not in last:
                break
        self.stop()
        raise NginxError(f"nginx did not start: {last}")

    def _await(self, port: int) -> bool:
        """True once nginx answers on ``port``; False when it exited or did not answer in time."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline and self._proc.poll() is None:
            try:
                with opener.open(f"http://127.0.0.1:{port}/", timeout=2):
                    return True
            except urllib.error.HTTPError:
                return True  # it answers (a 403/404 for the root is still nginx)
            except OSError:
                time.sleep(0.05)
        return False

    def _log_tail(self) -> str:
        text = ""
        for name in ("stderr.log", "error.log"):
            try:
                with open(os.path.join(self.work, name), errors="replace") as f:
                    text += f.read()
            except OSError:
                pass
        return " ".join(text.split())[-600:] or "no error logged"

    def _reap(self) -> None:
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.terminate()  # SIGTERM: nginx's fast shutdown, master and worker
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, 9)
                self._proc.wait(5)
        self._proc = None

    def stop(self) -> None:
        """Stop nginx (and its worker), reap it, remove its directory. Idempotent."""
        self._reap()
        self.port = None
        if self.work:
            shutil.rmtree(self.work, ignore_errors=True)
            self.work = ""
