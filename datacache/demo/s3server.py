"""A moto S3 server in a child process, for the demo and the tests.

Why a subprocess: moto's server is a pure-Python WSGI app. Run in-process it would share our GIL
with the code under test (cache workers, FUSE, benchmarks), so every S3 request would steal time
from the thing being measured, and a hang in one would hang the other. As a child process it is
just another HTTP endpoint on loopback, like a real object store.

Lifetime: the child never outlives its ``MotoServer``. ``stop()`` (called by ``__exit__``, by an
exception while starting, at interpreter exit, and on garbage collection) sends SIGTERM, waits, then
SIGKILLs and reaps. If this process dies without running any of that (SIGKILL, OOM), a watchdog
thread in the child notices that its parent changed and exits; that is why the child is started
through a ten-line wrapper around ``moto.server.main`` (``_CHILD_CODE``) rather than
``python -m moto.server`` directly.

Ranged GETs (``ranges``): ``"stored"`` (the default) serves a ``Range`` from the key's stored
buffer, reading only that range, as S3 does (``datacache.demo.moto_ranges``, installed in the
child); ``"moto"`` is stock moto, which reads the whole object for every ranged GET.

Stored objects stay in the server's memory up to :data:`KEY_BUFFER_BYTES` each (moto's
``MOTO_S3_DEFAULT_KEY_BUFFER_SIZE``, unless the environment sets it). moto's default spools an
object over 5 MiB to a temporary file, and a benchmark that drops the page cache before a cold
read then made the server read those from disk too, while smaller objects (JuiceFS's 4 MiB
chunks) stayed in memory: the store's own storage is not the cache under test. Measured (56 x
8 MiB, DLIO's warmup, 2026-12-05): the server read 4.7 GB from disk over ten warmups.

Credentials are the dummy values ``testing``/``testing``; they are passed to s3fs explicitly, never
through this process's environment, and never logged.
"""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from typing import Any

__all__ = ["RANGES", "MotoServer", "MotoServerError"]

DUMMY_KEY = "testing"
DUMMY_SECRET = "testing"
DEFAULT_REGION = "eu-west-1"
#: ``MotoServer(ranges=...)``: how a ranged GET is served (see the module doc)
RANGES = ("stored", "moto")
#: bytes: objects up to this size stay in the server's memory (moto spools larger ones to a temporary
#: file); see the module doc
KEY_BUFFER_BYTES = 2 << 30
_RANGES_MODULE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "moto_ranges.py")


class MotoServerError(RuntimeError):
    """The moto server did not start (or stopped answering)."""


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _tail(path: str, n_bytes: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - n_bytes))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return "<no output>"


def _stop_process(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM, wait ``timeout``, SIGKILL, reap. Safe to call twice."""
    if proc.poll() is None:
        try:
            proc.terminate()
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        except ProcessLookupError:  # pragma: no cover - raced with its exit
            pass
    proc.wait()


class MotoServer:
    """moto's S3 server on ``127.0.0.1:<free port>`` as a child process; ``ranges``: ``"stored"``
    (a ranged GET reads only its range) or ``"moto"`` (stock: the whole object), see the module
    doc; ValueError for another value.

    >>> with MotoServer() as srv:
    ...     fs = srv.s3fs()
    ...     fs.mkdir("bucket")
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int | None = None,
        *,
        start_timeout: float = 30.0,
        stop_timeout: float = 5.0,
        ranges: str = "stored",
    ) -> None:
        if ranges not in RANGES:
            raise ValueError(f"MotoServer ranges={ranges!r}: use one of {', '.join(RANGES)}")
        self.ranges = ranges
        self.host = host
        self._requested_port = port
        self.port: int | None = None
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._proc: subprocess.Popen | None = None
        self._log_path: str | None = None
        self._finalizer: weakref.finalize | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> "MotoServer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> "MotoServer":
        if self.running:
            return self
        # A free port picked here can be taken before moto binds it; retry with a new one then.
        attempts = 1 if self._requested_port else 3
        last_error: MotoServerError | None = None
        for _ in range(attempts):
            try:
                self._start_once(self._requested_port or _free_port(self.host))
                return self
            except MotoServerError as e:
                last_error = e
                if "address already in use" not in str(e).lower():
                    break
        assert last_error is not None
        raise last_error

    def _start_once(self, port: int) -> None:
        fd, self._log_path = tempfile.mkstemp(prefix="datacache-moto-", suffix=".log")
        env = dict(os.environ)
        # moto makes boto3 sessions internally; a profile named here but absent would break them.
        env.pop("AWS_PROFILE", None)
        env["MOTO_PORT"] = str(port)
        env.setdefault("MOTO_S3_DEFAULT_KEY_BUFFER_SIZE", str(KEY_BUFFER_BYTES))
        cmd = [
            sys.executable, "-u", "-c", _CHILD_CODE, str(os.getpid()),
            _RANGES_MODULE if self.ranges == "stored" else "-",
            "-H", self.host, "-p", str(port),
        ]
        try:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=subprocess.STDOUT,
                env=env,
                close_fds=True,
            )
        finally:
            os.close(fd)
        self.port = port
        self._finalizer = weakref.finalize(self, _finalize, self._proc, self._log_path, self.stop_timeout)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.start_timeout
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy
        delay = 0.05
        while True:
            code = self._proc.poll()
            if code is not None:
                raise MotoServerError(
                    f"moto server exited with code {code} before answering on {self.endpoint_url}; "
                    f"its output ends with:\n{_tail(self._log_path or '')}"
                )
            try:
                with opener.open(self.endpoint_url + "/moto-api/", timeout=2) as r:
                    r.read()
                return
            except urllib.error.HTTPError:
                return  # it answered HTTP: ready
            except (OSError, http.client.HTTPException):
                pass
            if time.monotonic() > deadline:
                raise MotoServerError(
                    f"moto server did not answer on {self.endpoint_url} within {self.start_timeout:.0f} s; "
                    f"its output ends with:\n{_tail(self._log_path or '')}"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def stop(self) -> None:
        """Terminate (then kill) and reap the server; remove its log. Idempotent."""
        if self._finalizer is not None:
            self._finalizer()  # runs _finalize once, then detaches
            self._finalizer = None
        self._proc = None

    def log_tail(self, n_bytes: int = 4000) -> str:
        """The end of the server's output (request log and errors), for diagnostics."""
        return _tail(self._log_path, n_bytes) if self._log_path else ""

    # -- clients ---------------------------------------------------------------------------------

    @property
    def endpoint_url(self) -> str:
        if self.port is None:
            raise MotoServerError("moto server is not started")
        return f"http://{self.host}:{self.port}"

    def storage_options(self) -> dict[str, Any]:
        """fsspec/s3fs options for this server: ``fsspec.filesystem("s3", **srv.storage_options())``.

        Credentials and region are explicit so no ambient AWS configuration is consulted. The
        region is not ``us-east-1`` because s3fs's ``mkdir`` sends the client's region as the
        bucket's LocationConstraint, which S3 (and moto) reject for ``us-east-1``. ``verify`` is
        off because the endpoint is plain HTTP on loopback: there is no TLS to verify, but
        aiobotocore still loads ``$AWS_CA_BUNDLE`` when it is set and fails every request if that
        file is missing.
        """
        return {
            "endpoint_url": self.endpoint_url,
            "key": DUMMY_KEY,
            "secret": DUMMY_SECRET,
            "client_kwargs": {"region_name": DEFAULT_REGION, "verify": False},
        }

    def s3fs(self, **kwargs: Any):
        """A fresh ``s3fs.S3FileSystem`` talking to this server (not shared via fsspec's cache)."""
        import s3fs

        opts = self.storage_options()
        opts.update(kwargs)
        opts.setdefault("skip_instance_cache", True)
        return s3fs.S3FileSystem(**opts)

    def reset(self) -> None:
        """Drop every bucket and object (moto's reset API)."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        req = urllib.request.Request(self.endpoint_url + "/moto-api/reset", method="POST")
        with opener.open(req, timeout=30) as r:
            r.read()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        where = self.endpoint_url if self.port else "-"
        return f"<MotoServer {where} {state}, ranges {self.ranges}>"


def _finalize(proc: subprocess.Popen, log_path: str | None, timeout: float) -> None:
    _stop_process(proc, timeout)
    if log_path:
        try:
            os.unlink(log_path)
        except OSError:
            pass


# -- child side ----------------------------------------------------------------------------------

# Run with ``python -u -c _CHILD_CODE <parent pid> <moto_ranges.py path or -> <moto.server args>``.
# It takes the current directory off sys.path first (nothing there may shadow moto's imports) and
# does not import datacache (moto_ranges.py is loaded by its path). Werkzeug's per-request log lines are dropped (WARNING and up are kept), so the log that
# start-up errors are read from stays small however many requests a benchmark makes. Werkzeug adds a ``Server`` header to every response and moto adds another; aiohttp's strict
# parser (asyncio debug mode: ``-X dev``, ``PYTHONASYNCIODEBUG=1``) rejects the duplicate, so the
# child drops werkzeug's.
_CHILD_CODE = """
import os, sys
sys.path[:] = [p for p in sys.path if p not in ("", ".", os.getcwd())]
import logging, signal, threading, time
logging.getLogger("werkzeug").setLevel(logging.WARNING)
parent = int(sys.argv[1])
def watch():
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)  # our parent died without stopping us
threading.Thread(target=watch, daemon=True).start()
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
from werkzeug.serving import WSGIRequestHandler
def send_response(self, code, message=None):  # no 2nd Server header: moto sends its own
    self.log_request(code)
    self.send_response_only(code, message)
    self.send_header("Date", self.date_time_string())
WSGIRequestHandler.send_response = send_response
if sys.argv[2] != "-":
    import importlib.util
    spec = importlib.util.spec_from_file_location("moto_ranges", sys.argv[2])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.install()
from moto.server import main
main(sys.argv[3:])
"""
