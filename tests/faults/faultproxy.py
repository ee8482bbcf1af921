"""A fault-injecting TCP proxy in front of an HTTP (S3) endpoint, switched by the test at run time.

``benchmarks/proxy.DelayProxy`` models a healthy remote store (latency, bandwidth) in a child
process with fixed settings; fault tests need to switch the source's behaviour while reads run, so
this proxy runs in threads of the test process and reads its ``mode`` on every request:

| mode        | what the client sees                                                       |
|-------------|----------------------------------------------------------------------------|
| ``pass``    | the upstream's answer                                                      |
| ``refuse``  | connection refused (the listening socket is closed)                        |
| ``stall``   | the request is read, nothing ever comes back (until the mode changes)      |
| ``reset``   | the upstream's headers and half its body, then a TCP reset                 |
| ``500``     | ``500 InternalError`` (S3 XML error body)                                  |
| ``503``     | ``503 ServiceUnavailable``                                                 |
| ``slowdown``| ``503 SlowDown`` (S3's throttling answer)                                  |

``delay`` (seconds, default 0) holds every request before it is handled, to make a slow source.

Each client connection carries one request (the answer says ``Connection: close``), forwarded on a
fresh upstream connection byte for byte except the ``Connection`` header, which SigV4 does not sign.
``requests`` counts requests per ``(method, path)`` with the query string dropped, so a test can
assert how many object reads reached the source (single-flight).
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections import Counter
from urllib.parse import urlsplit

MODES = ("pass", "refuse", "stall", "reset", "500", "503", "slowdown")
_ERRORS = {"500": (500, "Internal Server Error", "InternalError"),
           "503": (503, "Service Unavailable", "ServiceUnavailable"),
           "slowdown": (503, "Slow Down", "SlowDown")}


class FaultProxy:
    """Proxy on 127.0.0.1 (a free port, kept across ``refuse``) to ``upstream`` (``http://h:p``).

    Use as a context manager; ``endpoint_url`` is what clients use; ``set_mode(m)`` switches.
    """

    def __init__(self, upstream: str):
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.mode = "pass"
        self.delay = 0.0
        self.requests: Counter = Counter()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stop = False
        self._listener: socket.socket | None = None
        self.port = 0

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "FaultProxy":
        self._listen()
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._stop = True
            self._changed.notify_all()
        self._close_listener()

    def set_mode(self, mode: str) -> None:
        """Switch behaviour for every request from now on (stalled requests are then dropped)."""
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r} (known: {', '.join(MODES)})")
        with self._lock:
            old, self.mode = self.mode, mode
            self._changed.notify_all()
        if mode == "refuse":
            self._close_listener()
        elif old == "refuse":
            self._listen()

    def object_gets(self, key_suffix: str) -> int:
        """GET requests so far whose path ends with ``key_suffix``."""
        with self._lock:
            return sum(n for (method, path), n in self.requests.items()
                       if method == "GET" and path.endswith(key_suffix))

    # -- internals ---------------------------------------------------------------------------
    def _listen(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(256)
        self.port = sock.getsockname()[1]
        self._listener = sock
        threading.Thread(target=self._accept, args=(sock,), daemon=True).start()

    def _close_listener(self) -> None:
        sock, self._listener = self._listener, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return  # listener closed
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            head, body = _read_request(conn)
            if head is None:
                return
            method, target = head.split(b" ", 2)[:2]
            with self._lock:
                self.requests[(method.decode(), target.split(b"?")[0].decode())] += 1
                mode, delay = self.mode, self.delay
            time.sleep(delay)
            if mode == "stall":
                with self._lock:
                    self._changed.wait_for(lambda: self.mode != "stall" or self._stop)
                return
            if mode in _ERRORS:
                conn.sendall(_error_response(*_ERRORS[mode]))
                return
            answer = self._forward(head, body)
            if mode == "reset":
                cut = answer.find(b"\r\n\r\n") + 4
                conn.sendall(answer[:cut + (len(answer) - cut) // 2])
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return
            conn.sendall(answer)
        except OSError:
            pass
        finally:
            conn.close()

    def _forward(self, head: bytes, body: bytes) -> bytes:
        lines = [ln for ln in head.split(b"\r\n") if not ln.lower().startswith(b"connection:")]
        request = b"\r\n".join(lines + [b"Connection: close"]) + b"\r\n\r\n" + body
        with socket.create_connection(self.upstream, timeout=30) as up:
            up.sendall(request)
            chunks = []
            while data := up.recv(1 << 16):
                chunks.append(data)
        answer = b"".join(chunks)
        cut = answer.find(b"\r\n\r\n")
        lines = [ln for ln in answer[:cut].split(b"\r\n") if not ln.lower().startswith(b"connection:")]
        return b"\r\n".join(lines + [b"Connection: close"]) + answer[cut:]


def _read_request(conn: socket.socket) -> tuple[bytes | None, bytes]:
    """The request head (without the blank line) and its Content-Length body."""
    conn.settimeout(30)
    buf = b""
    while b"\r\n\r\n" not in buf:
        data = conn.recv(1 << 16)
        if not data:
            return None, b""
        buf += data
    head, rest = buf.split(b"\r\n\r\n", 1)
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        data = conn.recv(1 << 16)
        if not data:
            break
        rest += data
    return head, rest


def _error_response(status: int, reason: str, code: str) -> bytes:
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            f"<Message>injected by FaultProxy</Message><RequestId>{time.time_ns()}</RequestId></Error>").encode()
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body
