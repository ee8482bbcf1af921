"""Synchronous block GETs from cache workers, in the caller's thread.

A block read is the hot path: the Reader, FUSE and warmup threads wait on it, so it is a blocking
request on a pooled urllib3 connection (no hop to an event loop thread, the body read straight
into one ``bytes``), not an aiohttp call. Measured on the 2-core test machine with 4 MiB blocks:
aiohttp through a loop thread ~0.85 GB/s, urllib3 ~1 GB/s over TCP.

A worker on this node also listens on an abstract Unix socket named after its TCP address
(:func:`local_address`), as Alluxio's and HDFS's workers offer a domain socket to clients on their
node: the same HTTP API and token, without the TCP stack (loopback TCP tops out at ~1.8 GB/s here,
a Unix socket at ~9 GB/s). Abstract names live in the network namespace, not the filesystem: a
worker in another namespace (another host, as far as the network goes) is not reachable that
way, and nothing is left behind when a worker dies. A connection refused there (a worker that
has none, an older one) sends that worker's requests over TCP for :data:`LOCAL_RETRY_S` seconds,
and so does a local socket held by a process of another user than root or this one (its peer
credentials, ``SO_PEERCRED``): the token only goes where it could have been read from.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
import threading
import time
from urllib.parse import urlencode, urlsplit

import urllib3
from urllib3.connection import HTTPConnection
from urllib3.exceptions import ConnectTimeoutError, HTTPError, NewConnectionError, ReadTimeoutError

log = logging.getLogger(__name__)

LOCAL_RETRY_S = 30.0
POOL_SIZE = 64  # idle connections kept per worker (FUSE: 32 request threads, plus read-ahead)
SOCKET_BUFFER = 8 << 20  # bytes: the worker's send buffer (the kernel caps it at 2 x wmem_max)


class TransportError(Exception):
    """A request that got no HTTP answer; ``timeout`` is ``"connect"``, ``"read"`` or ``""``."""

    def __init__(self, message: str, timeout: str = ""):
        super().__init__(message)
        self.timeout = timeout


class _LocalRefused(NewConnectionError):
    """No worker listens on the local socket."""


def local_address(url: str) -> str:
    """The abstract Unix socket name of the worker at ``url`` (``http://host:port``): a str that
    starts with NUL (Linux abstract namespace)."""
    parts = urlsplit(url)
    return f"\0datacache-worker {parts.hostname}:{parts.port}"


def listen_local(url: str) -> socket.socket | None:
    """A listening socket on :func:`local_address` of ``url``, or None when the name is taken
    (another process serves it: clients then find the worker over TCP only)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(local_address(url))
        sock.listen(128)
    except OSError:
        sock.close()
        return None
    sock.setblocking(False)
    return sock


def widen_send_buffer(conn: asyncio.BaseTransport | None) -> None:
    """Worker side, before answering a block request on ``conn``: a local-socket connection gets
    a send buffer of :data:`SOCKET_BUFFER` bytes (an accepted Unix socket does not inherit the
    listener's; with the default ~200 KiB, sendfile of a 4 MiB block waits on the event loop
    about 20 times). TCP connections keep the kernel's auto-tuning."""
    sock = conn.get_extra_info("socket") if conn is not None else None
    if sock is not None and sock.family == socket.AF_UNIX:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)


def _peer_uid(sock: socket.socket) -> int:
    """The user id of the process that bound the Unix socket ``sock`` is connected to."""
    _, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return uid


class _UnixConnection(HTTPConnection):
    """urllib3's HTTP connection over an abstract Unix socket (``unix_address``). The socket
    must be held by root or this process's user: an abstract name has no file permissions, and a
    process of another user that took it first would otherwise receive the bearer token."""

    unix_address = ""

    def _new_conn(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.unix_address)
            uid = _peer_uid(sock)
        except OSError as err:
            sock.close()
            raise _LocalRefused(self, f"local socket: {err}") from err
        if uid not in (0, os.geteuid()):
            sock.close()
            log.warning("the local socket of the cache worker at %s:%s is held by user id %d, not by root or this "
                        "user: using TCP", self.host, self.port, uid)
            raise _LocalRefused(self, f"local socket held by user id {uid}")
        return sock


class BlockTransport:
    """Blocking GETs to workers: per worker URL one TCP pool and, for a worker on this node, one
    local-socket pool tried first. Thread-safe. ``headers``: sent with every request (the bearer
    token); ``connect_timeout``/``read_timeout``: seconds to connect and between bytes."""

    def __init__(self, headers: dict, connect_timeout: float, read_timeout: float):
        self._headers = dict(headers)
        self._timeout = urllib3.Timeout(connect=connect_timeout, read=read_timeout)
        self._pools: dict[tuple[str, bool], urllib3.HTTPConnectionPool] = {}
        self._no_local: dict[str, float] = {}  # url -> monotonic time its local socket was refused
        self._lock = threading.Lock()

    def get(self, url: str, path: str, fields: dict, local: bool) -> tuple[int, dict, bytes]:
        """``(status, headers, body)`` of ``GET url+path?fields``; ``local``: the worker is on this
        node (its local socket is tried first; refused there, TCP). Raises
        :class:`TransportError` when no answer came (refused, timed out, reset)."""
        if local and time.monotonic() - self._no_local.get(url, float("-inf")) >= LOCAL_RETRY_S:
            try:
                return self._get(self._pool(url, True), path, fields)
            except _LocalRefused:
                self._no_local[url] = time.monotonic()  # no local socket there: TCP from now on
        return self._get(self._pool(url, False), path, fields)

    def _get(self, pool: urllib3.HTTPConnectionPool, path: str, fields: dict) -> tuple[int, dict, bytes]:
        try:
            resp = pool.urlopen("GET", f"{path}?{urlencode(fields)}", retries=False, redirect=False,
                                assert_same_host=False)
        except _LocalRefused:
            raise
        except NewConnectionError as err:  # a subclass of ConnectTimeoutError in urllib3 2
            raise TransportError(str(err)) from err
        except ConnectTimeoutError as err:
            raise TransportError(str(err), "connect") from err
        except ReadTimeoutError as err:
            raise TransportError(str(err), "read") from err
        except (HTTPError, OSError) as err:
            raise TransportError(f"{type(err).__name__}: {err}") from err
        return resp.status, resp.headers, resp.data

    def _pool(self, url: str, local: bool) -> urllib3.HTTPConnectionPool:
        with self._lock:
            pool = self._pools.get((url, local))
            if pool is None:
                parts = urlsplit(url)
                pool = urllib3.HTTPConnectionPool(parts.hostname, parts.port, maxsize=POOL_SIZE, block=False,
                                                  timeout=self._timeout, retries=False, headers=self._headers)
                if local:
                    pool.ConnectionCls = type("WorkerUnixConnection", (_UnixConnection,),
                                              {"unix_address": local_address(url)})
                self._pools[(url, local)] = pool
            return pool

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()
