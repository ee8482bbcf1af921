"""A delay/bandwidth proxy: makes a loopback HTTP (S3) endpoint behave like a remote object store.

``tc netem`` is not available on these machines, so benchmarks and fault tests put this small
aiohttp reverse proxy between a client and a loopback server (moto's S3 server, nginx)::

    with MotoServer() as s3, DelayProxy(s3.endpoint_url, latency_ms=20, bandwidth_mbps=100) as proxy:
        fs = s3fs.S3FileSystem(endpoint_url=proxy.endpoint_url, ...)

Model, per request (an HTTP/1.1 connection carries one request at a time, so "per request" is
"per connection"; N parallel connections get N times the bandwidth, as with a real store):

- **first-byte latency**: the request is held ``latency_ms`` before it is forwarded upstream, so
  the time to the first response byte is ``latency_ms`` + the upstream's own time (a remote
  store's TTFB is its round trip plus its service time);
- **bandwidth**: the response body (and a request body, e.g. a PUT) is streamed in chunks of
  ``chunk_bytes`` and paced so that, counted from the first byte, the stream never runs ahead of
  ``bandwidth_mbps`` MB/s (MB = 10^6 bytes). 0 means unlimited.

Transparency, and why: everything the client sent is forwarded as sent - method, the raw
(still percent-encoded) path and query, and every header except the hop-by-hop ones (RFC 9110
7.6.1: Connection, Keep-Alive, Proxy-*, TE, Trailer, Transfer-Encoding, Upgrade) and ``Expect``
(100-continue is answered by this proxy's own server; SigV4 never signs it). In particular
**Host is forwarded unchanged**: S3 SigV4 signs the Host header, and the client signed the
proxy's ``host:port``, so the upstream must see that same value (the canonical request is
rebuilt from what the server receives). Range, If-Match, Authorization, x-amz-* and Content-MD5
pass untouched; nothing is decompressed (``auto_decompress=False``) or added (aiohttp's automatic
User-Agent/Accept/Accept-Encoding are skipped). Response headers come back the same way, with
Content-Length kept so bodies are not re-chunked. A failed upstream is a 502 with a one-line body.

A client that leaves in the middle of a response is normal, not an error, and is not logged:
fsspec's ``HTTPFileSystem.exists`` GETs a file and drops the connection after the headers (and
``simplecache::`` calls it before every download), so a run makes thousands of such requests.

Process model: the proxy runs as a child process (``python benchmarks/proxy.py --upstream ...``),
not a thread, so that its event loop does not share the benchmark's GIL (like
``datacache.demo.s3server.MotoServer``). The child binds port 0 and prints the port it got on
a pipe that carries only that line, so there is no race for a free port; its stdout and stderr
go to an unnamed temporary file (``log_tail()`` reads it). Never to a pipe nobody reads: once 64 KiB of
output filled it, the child's event loop would block in ``write(2)`` and every request through the
proxy would wait forever (issue 8: aiohttp logged a traceback per dropped response, and the
full-size HTTP run hung). A watchdog thread ends the child if its parent dies without stopping
it. ``DelayProxy`` is a context manager with ``endpoint_url``, ``pid`` and ``stop()``, which
terminates, then kills, and reaps it.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import tempfile
import time
import weakref
from typing import TextIO

__all__ = ["DelayProxy", "DelayProxyError"]

HOP_BY_HOP = frozenset(h.lower() for h in (
    "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection",
    "TE", "Trailer", "Trailers", "Transfer-Encoding", "Upgrade", "Expect",
))
DEFAULT_CHUNK = 256 << 10  # bytes per paced write (at 100 MB/s: one write every 2.6 ms)


class DelayProxyError(RuntimeError):
    """The proxy did not start."""


class DelayProxy:
    """A delay/bandwidth reverse proxy in front of ``upstream`` (``http://host:port``), in a child
    process on ``host`` (loopback by default). ``latency_ms``: added before each request is
    forwarded; ``bandwidth_mbps``: MB/s (10^6 bytes) per connection, each direction (0:
    unlimited); ``chunk_bytes``: size of the paced writes."""

    def __init__(self, upstream: str, latency_ms: float = 20.0, bandwidth_mbps: float = 100.0, *,
                 host: str = "127.0.0.1", chunk_bytes: int = DEFAULT_CHUNK, start_timeout: float = 30.0):
        if latency_ms < 0 or bandwidth_mbps < 0 or chunk_bytes < 1:
            raise ValueError("latency_ms and bandwidth_mbps must be >= 0, chunk_bytes >= 1")
        self.upstream = upstream.rstrip("/")
        self.latency_ms = float(latency_ms)
        self.bandwidth_mbps = float(bandwidth_mbps)
        self.host = host
        self.chunk_bytes = int(chunk_bytes)
        self.start_timeout = start_timeout
        self.port: int | None = None
        self._proc: subprocess.Popen | None = None
        self._log = None  # the child's output file (see the module doc)
        self._finalizer: weakref.finalize | None = None

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def endpoint_url(self) -> str:
        if self.port is None:
            raise DelayProxyError("the proxy is not started")
        return f"http://{self.host}:{self.port}"

    def describe(self) -> str:
        bw = f"{self.bandwidth_mbps:g} MB/s per connection" if self.bandwidth_mbps else "unlimited bandwidth"
        return f"+{self.latency_ms:g} ms first byte, {bw}"

    def start(self) -> DelayProxy:
        if self._proc is not None and self._proc.poll() is None:
            return self
        cmd = [sys.executable, "-u", os.path.abspath(__file__), "--parent", str(os.getpid()),
               "--upstream", self.upstream, "--host", self.host, "--latency-ms", repr(self.latency_ms),
               "--bandwidth-mbps", repr(self.bandwidth_mbps), "--chunk-bytes", str(self.chunk_bytes)]
        self._log = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=self._log, close_fds=True)
        self._finalizer = weakref.finalize(self, _stop_process, self._proc, self._log)
        try:
            self.port = self._read_port()
        except BaseException:
            self.stop()
            raise
        return self

    def _read_port(self) -> int:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        deadline = time.monotonic() + self.start_timeout
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                raise DelayProxyError(f"the proxy did not start within {self.start_timeout:.0f} s")
            ready, _, _ = select.select([proc.stdout], [], [], min(left, 0.5))
            if ready:
                byte = os.read(proc.stdout.fileno(), 1)
                if not byte:
                    break
                line += byte
            elif proc.poll() is not None:
                break
        text = line.decode(errors="replace").strip()
        if not text.startswith("PORT "):
            raise DelayProxyError(f"the proxy failed to start (exit {proc.poll()}): {text} {self.log_tail()}")
        return int(text.split()[1])

    def log_tail(self, nbytes: int = 2000) -> str:
        """The last ``nbytes`` bytes the child wrote to stdout/stderr (tracebacks of failed upstream
        requests), as text; "" when it is stopped."""
        if self._log is None or self._log.closed:
            return ""
        size = os.fstat(self._log.fileno()).st_size
        return os.pread(self._log.fileno(), nbytes, max(0, size - nbytes)).decode(errors="replace")

    def stop(self) -> None:
        """Terminate (then kill) and reap the proxy. Idempotent."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self._proc = None

    def __repr__(self) -> str:
        where = self.endpoint_url if self.port else "-"
        return f"<DelayProxy {where} -> {self.upstream}, {self.describe()}>"


def _stop_process(proc: subprocess.Popen, log, timeout: float = 5.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    proc.wait()
    for stream in (proc.stdout, log):
        if stream is not None:
            stream.close()


# -- the child -----------------------------------------------------------------------------------

class _Pacer:
    """Keeps one stream at or below ``rate`` bytes/s, counted from its first byte."""

    def __init__(self, rate: float):
        self.rate = rate
        self.t0: float | None = None
        self.sent = 0

    async def pace(self, nbytes: int) -> None:
        import asyncio

        if self.rate <= 0:
            return
        now = time.monotonic()
        if self.t0 is None:
            self.t0 = now
        self.sent += nbytes
        ahead = self.t0 + self.sent / self.rate - now
        if ahead > 0:
            await asyncio.sleep(ahead)


def _serve(upstream: str, host: str, latency_ms: float, bandwidth_mbps: float, chunk: int,
           port_out: TextIO) -> None:
    import asyncio

    import aiohttp
    from aiohttp import web
    from yarl import URL

    rate = bandwidth_mbps * 1e6
    latency = latency_ms / 1000.0
    skip_auto = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")

    async def paced_body(request: web.Request):
        pacer = _Pacer(rate)
        while True:
            data = await request.content.read(chunk)
            if not data:
                return
            yield data
            await pacer.pace(len(data))

    async def handle(request: web.Request) -> web.StreamResponse:
        session: aiohttp.ClientSession = request.app["session"]
        if latency:
            await asyncio.sleep(latency)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        has_body = request.body_exists or request.headers.get("Transfer-Encoding", "").lower() == "chunked"
        data = paced_body(request) if has_body else None
        if data is not None and "Content-Length" not in request.headers:
            kwargs = {"chunked": True}
        else:
            kwargs = {}
        url = URL(upstream + request.raw_path, encoded=True)
        resp: web.StreamResponse | None = None
        try:
            async with session.request(request.method, url, headers=headers, data=data, allow_redirects=False,
                                       skip_auto_headers=skip_auto, **kwargs) as up:
                resp = web.StreamResponse(status=up.status, reason=up.reason)
                for k, v in up.headers.items():
                    if k.lower() not in HOP_BY_HOP:
                        resp.headers.add(k, v)
                await resp.prepare(request)
                if request.method != "HEAD":
                    pacer = _Pacer(rate)
                    async for piece in up.content.iter_chunked(chunk):
                        await resp.write(piece)
                        await pacer.pace(len(piece))
                await resp.write_eof()
                return resp
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as err:
            if request.transport is None or request.transport.is_closing():
                # The client left (see the module doc): end quietly; aiohttp drops the connection
                # when it cannot finish this response.
                return resp if resp is not None else web.Response(status=499)
            if resp is not None and resp.prepared:
                raise  # headers already sent: the connection is dropped
            return web.Response(status=502, text=f"delay proxy: upstream {upstream} failed: "
                                                  f"{type(err).__name__}: {err}\n")

    async def on_startup(app: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None, force_close=False)
        app["session"] = aiohttp.ClientSession(connector=connector, auto_decompress=False, trust_env=False,
                                               timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))

    async def on_cleanup(app: web.Application) -> None:
        await app["session"].close()

    async def main() -> None:
        app = web.Application(client_max_size=0)
        app.router.add_route("*", "/{tail:.*}", handle)
        app.on_startup.append(on_startup)
        app.on_cleanup.append(on_cleanup)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, auto_decompress=False)
        await runner.setup()
        site = web.TCPSite(runner, host, 0, backlog=1024)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        port_out.write(f"PORT {port}\n")
        port_out.close()  # nothing else goes to the pipe the parent stops reading (see the module doc)
        await asyncio.Event().wait()

    asyncio.run(main())


def _child_main(argv: list[str]) -> None:
    import argparse
    import signal
    import threading

    ap = argparse.ArgumentParser(prog="benchmarks/proxy.py", description="delay/bandwidth HTTP proxy (child)")
    ap.add_argument("--parent", type=int, required=True)
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--bandwidth-mbps", type=float, default=100.0)
    ap.add_argument("--chunk-bytes", type=int, default=DEFAULT_CHUNK)
    args = ap.parse_args(argv)

    def watch() -> None:
        while os.getppid() == args.parent:
            time.sleep(0.5)
        os._exit(0)  # our parent died without stopping us

    threading.Thread(target=watch, daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    # The parent's pipe carries the port line only; stdout joins stderr (the output file).
    port_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    _serve(args.upstream.rstrip("/"), args.host, args.latency_ms, args.bandwidth_mbps, args.chunk_bytes, port_out)


if __name__ == "__main__":
    # Run as a script: its own folder (benchmarks/) is sys.path[0]; take it off so nothing there
    # shadows a module the proxy imports.
    sys.path[:] = [p for p in sys.path[1:] if p not in ("", ".")]
    _child_main(sys.argv[1:])
