"""The blocking block transport: a worker with no local socket is reached over TCP, and only a
refused local connection (not a timeout) sends a worker's requests there."""
from __future__ import annotations

import http.server
import multiprocessing
import os
import socket
import threading

import pytest

from datacache.cluster import transport
from datacache.cluster.transport import BlockTransport, TransportError


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"{self.path} {self.headers.get('Authorization')}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def tcp_only_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_worker_without_a_local_socket_is_reached_over_tcp(tcp_only_server):
    blocks = BlockTransport({"Authorization": "Bearer t0"}, 1.0, 5.0)
    try:
        for _ in range(2):
            status, _, body = blocks.get(tcp_only_server, "/v1/block", {"key": "a b"}, local=True)
            assert (status, body) == (200, b"/v1/block?key=a+b Bearer t0")
    finally:
        blocks.close()


def test_a_local_socket_that_never_answers_times_out_instead_of_falling_back(tcp_only_server):
    silent = transport.listen_local(tcp_only_server)  # accepts, never answers
    assert silent is not None
    blocks = BlockTransport({}, 1.0, 0.5)
    try:
        with pytest.raises(TransportError) as err:
            blocks.get(tcp_only_server, "/v1/block", {}, local=True)
        assert err.value.timeout == "read"
    finally:
        blocks.close()
        silent.close()


def test_the_local_name_is_taken_once_and_dies_with_its_socket(tcp_only_server):
    first = transport.listen_local(tcp_only_server)
    assert first is not None and transport.listen_local(tcp_only_server) is None
    first.close()
    again = transport.listen_local(tcp_only_server)
    assert again is not None  # nothing left behind on the filesystem to clean up
    again.close()
    with pytest.raises(ConnectionRefusedError):
        socket.socket(socket.AF_UNIX).connect(transport.local_address(tcp_only_server))


def _squat(url: str, ready, got) -> None:
    """As user nobody: take the worker's local name and report what a client sends."""
    os.setuid(65534)
    sock = transport.listen_local(url)
    sock.setblocking(True)
    ready.set()
    conn, _ = sock.accept()
    conn.settimeout(2)
    try:
        got.put(conn.recv(4096))
    except OSError:
        got.put(b"")


def test_a_local_socket_of_another_user_gets_no_request_and_tcp_answers(tcp_only_server):
    if os.geteuid() != 0:
        pytest.skip("needs root to act as a second user (CI runs as root)")
    ctx = multiprocessing.get_context("fork")
    ready, got = ctx.Event(), ctx.Queue()
    squatter = ctx.Process(target=_squat, args=(tcp_only_server, ready, got))
    squatter.start()
    assert ready.wait(10)
    blocks = BlockTransport({"Authorization": "Bearer secret-token"}, 1.0, 5.0)
    try:
        status, _, body = blocks.get(tcp_only_server, "/v1/block", {"key": "k"}, local=True)
        assert (status, body) == (200, b"/v1/block?key=k Bearer secret-token")  # from the TCP server
        assert got.get(timeout=10) == b""  # connected, then closed unused: the token never went there
    finally:
        blocks.close()
        squatter.join(10)
