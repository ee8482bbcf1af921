"""A stalled cache worker (it accepts TCP connections and never answers) costs one bounded timeout,
not a hung warmup: its share goes to the next workers, reads stay right, and what is reported
names the worker and the timeout (``cache worker worker-2 timed out after 2s``)."""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time

import pytest

from cluster_support import (MiB, apply_cluster, block_bytes, live, open_client, stored_keys, wait_for,
                             write_files)
from datacache.cluster.auth import runtime_dir
from datacache.cluster.member import Member
from datacache.cluster.membership import Membership
from datacache.control.supervisor import read_pid
from datacache.warmup import warmup
from datacache.demo.sample_data import sha256_bytes

NAME = "st"
BLOCK = 256 << 10


@pytest.fixture
def stalled_worker(cluster_home):
    """A registered, heartbeating ``worker-2`` whose port accepts connections and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    held, stop = [], threading.Event()

    def accept():
        while not stop.is_set():
            try:
                held.append(server.accept()[0])  # kept open, never read, never answered
            except OSError:
                return

    def heartbeat():
        members = Membership(str(cluster_home))
        member = Member("worker-2", f"http://127.0.0.1:{server.getsockname()[1]}", socket.gethostname(), os.getpid())
        members.register("default", NAME, member)
        while not stop.wait(0.5):
            members.heartbeat("default", NAME, "worker-2", os.getpid())
        members.remove("default", NAME, "worker-2")
        members.close()

    threads = [threading.Thread(target=accept, daemon=True), threading.Thread(target=heartbeat)]
    try:
        yield threads
    finally:
        stop.set()
        server.close()
        for t in threads:
            if t.ident is not None:
                t.join(10)
        for conn in held:
            conn.close()


def test_a_stalled_worker_times_out_and_is_reported(cluster_home, tmp_path, stalled_worker):
    src = tmp_path / "src"
    contents = write_files(src, {f"f{i:02d}.bin": MiB + i for i in range(12)})
    plane = apply_cluster(cluster_home, NAME, [{"name": "local", "mountPoint": str(src)}], replicas=2)
    for t in stalled_worker:
        t.start()
    client = open_client(plane, NAME, short_circuit=False, connect_timeout=1.0, read_timeout=2.0)
    try:
        wait_for(lambda: sorted(live(cluster_home, NAME)) == ["worker-0", "worker-1", "worker-2"], 10,
                 "the stalled worker to register")
        started = time.monotonic()
        result = warmup(client)
        assert result.ok, result.targets
        assert time.monotonic() - started < 30  # was ~306 s: a 300 s read timeout per fill
        progress = client.source.worker_progress()
        assert "worker-2" not in progress
        assert client.source.worker_failures() == {"worker-2": "cache worker worker-2 timed out after 2s"}
        keys = block_bytes(client.manifest, BLOCK, NAME)
        stored = stored_keys(cluster_home, NAME)
        assert set(keys) <= stored["worker-0"] | stored["worker-1"]
        assert sum(p["bytes"] for p in progress.values()) == sum(keys.values())
        started = time.monotonic()
        for path, data in contents.items():
            with client.open(path) as f:
                assert sha256_bytes(f.read()) == sha256_bytes(data), path
        assert time.monotonic() - started < 30
    finally:
        client.close()

    # Every worker stalled: the warmup fails within a few timeouts, saying which worker timed out.
    rdir = runtime_dir(str(cluster_home), "default", NAME)
    pids = [read_pid(os.path.join(rdir, f)) for f in ("supervisor.pid", "worker-0.pid", "worker-1.pid")]
    client = open_client(plane, NAME, short_circuit=False, connect_timeout=1.0, read_timeout=1.0)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        result = warmup(client, ["f00.bin"])
        elapsed = time.monotonic() - started
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        client.close()
    assert elapsed < 10 and not result.ok
    (failure,) = result.targets[0].failures
    # A small load is cut into one-block segments (parallel GETs); the first that failed is named.
    assert re.match(r"f00\.bin: OSError: no live cache worker could take blocks \[[0-3]\]: ", failure), failure
    for worker in ("worker-0", "worker-1", "worker-2"):
        assert f"cache worker {worker} timed out after 1s" in failure
    plane.close()
