"""Cache worker read path: block GET over loopback vs reading the block file, and aggregate
throughput with 1, 2 and 3 workers. Prints measured numbers only.

Run: ``python -m benchmarks.worker_get [--files 48] [--repeat 3] [--readers 8]``

Set-up (one temporary directory, removed at the end): a local source of ``--files`` files of
4 MiB, a Dataset and a CacheRuntime (4 MiB blocks, SSD tier) applied embedded, and worker
processes started with ``datacache worker serve`` (1, then 2, then 3; each with its own cache
directory), all warmed up first, so every number below is a cache hit (block files in the page
cache, as on a busy worker).

1. One worker, one block at a time: GET over HTTP on loopback TCP and on the worker's same-node
   local socket (abstract Unix socket; the worker sends the block file with sendfile, the client
   checks the xxh3 checksum) vs reading the same block files directly (``DiskTier.get``: index
   lookup, read, checksum: the short-circuit path) and vs a bare ``open().read()``. Throughput
   ratio and per-block latency (median, p99). The goal (>= 0.5x the file read) is met on the local
   socket; over TCP the bare transport row shows this machine's ceiling.
2. Aggregate: ``--readers`` threads reading every block through ``ClusterBlockSource`` over HTTP
   (short-circuit off, so the local socket), with 1, 2 and 3 workers.

On a 2-core machine the client, the workers and the kernel's loopback share two cores, so adding
workers cannot add throughput here; on a cluster each worker brings its own cores, disk and NIC,
and HRW spreads blocks evenly over them (see the README's architecture section).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from benchmarks.common import format_table
from datacache.api.loader import load_resource_dict
from datacache.cache.budget import MemoryBudget
from datacache.cache.disk import DiskTier
from datacache.cluster.auth import ensure_token, load_token
from datacache.cluster.worker_client import LoopThread, WorkerClient
from datacache.cluster.membership import Membership
from datacache.cluster.worker_source import connect
from datacache.control.embedded import Embedded
from datacache.warmup import warmup

MiB = 1 << 20
BLOCK = 4 * MiB
NAME = "bench"


def _apply(home: str, src: str) -> Embedded:
    docs = [{"apiVersion": "datacache.io/v1alpha1", "kind": "Dataset", "metadata": {"name": NAME},
             "spec": {"mounts": [{"name": "local", "mountPoint": src}]}},
            {"apiVersion": "datacache.io/v1alpha1", "kind": "CacheRuntime", "metadata": {"name": NAME},
             "spec": {"replicas": 1, "blockSize": "4Mi",
                      "tieredstore": {"levels": [{"mediumtype": "SSD", "path": "cache", "quota": "4Gi"}]}}}]
    plane = Embedded(home)
    plane.apply([load_resource_dict(d, "benchmark") for d in docs])
    ensure_token(home, "default", NAME)
    return plane


def _start_workers(home: str, n: int) -> list[subprocess.Popen]:
    log = open(os.path.join(home, "workers.log"), "ab")
    procs = [subprocess.Popen([sys.executable, "-m", "datacache", "worker", "serve", NAME, "--home", home,
                               "--index", str(i)], stdout=log, stderr=log) for i in range(n)]
    log.close()
    members, deadline = Membership(home), time.monotonic() + 60
    while len(members.live("default", NAME)) < n:
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            _stop(procs)
            raise RuntimeError(f"workers did not start: see {home}/workers.log")
        time.sleep(0.05)
    members.close()
    return procs


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(30)


def _source(plane: Embedded):
    client = plane.open_dataset(NAME)
    client.source.close()
    client.source = connect(plane.home, plane.get("CacheRuntime", NAME), client.ufs, MemoryBudget(1 << 30),
                            short_circuit=False)
    return client


def _pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def _tcp_ceiling(path: str, n: int) -> list[float]:
    """Per-block seconds of the bare transport: sendfile(2) of ``path`` over loopback TCP into a
    preallocated buffer, no HTTP, no checksum (what any protocol on this machine pays at least)."""
    size = os.path.getsize(path)
    srv = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = srv.accept()
        with conn, open(path, "rb") as f:
            for _ in range(n):
                conn.recv(1)
                sent = 0
                while sent < size:
                    sent += os.sendfile(conn.fileno(), f.fileno(), sent, size - sent)

    threading.Thread(target=serve, daemon=True).start()
    lat, buf = [], bytearray(size)
    with socket.create_connection(srv.getsockname()) as s:
        view = memoryview(buf)
        for _ in range(n):
            t = time.perf_counter()
            s.send(b"x")
            got = 0
            while got < size:
                got += s.recv_into(view[got:])
            lat.append(time.perf_counter() - t)
    srv.close()
    return lat


def single_block(plane: Embedded, repeat: int) -> list[list[str]]:
    """Part 1: one worker; 4 MiB blocks read one at a time (and 4 at a time) several ways."""
    client = _source(plane)
    assert warmup(client).ok
    entries = list(client.manifest)
    member = Membership(plane.home).live("default", NAME)[0]
    tier = DiskTier(member.disk["path"], member.disk["quota"])
    keys = [str(client.source.key(e, 0)) for e in entries]
    paths = [tier.block_file(k) for k in keys]
    http = WorkerClient(load_token(plane.home, "default", NAME), NAME, BLOCK)
    io = LoopThread()

    def timed_get(e, local):
        t = time.perf_counter()
        data, _ = http.get_block(member.url, member.worker_id, e, 0, local=local)
        assert len(data) == BLOCK
        return time.perf_counter() - t

    def get_serial(local):
        return [timed_get(e, local) for e in entries]

    def get_parallel(local):
        with ThreadPoolExecutor(4) as pool:
            return list(pool.map(lambda e: timed_get(e, local), entries))

    def one_file(k):
        t = time.perf_counter()
        assert len(tier.get(k)) == BLOCK
        return time.perf_counter() - t

    def file_serial():
        return [one_file(k) for k in keys]

    def file_parallel():
        with ThreadPoolExecutor(4) as pool:
            return list(pool.map(one_file, keys))

    def bare_open():
        out = []
        for p in paths:
            t = time.perf_counter()
            with open(p, "rb") as f:
                f.read()
            out.append(time.perf_counter() - t)
        return out

    ways = [("GET over loopback TCP, 1 in flight (sendfile, checksum)", lambda: get_serial(False)),
            ("GET over loopback TCP, 4 in flight", lambda: get_parallel(False)),
            ("GET over the same-node local socket, 1 in flight", lambda: get_serial(True)),
            ("GET over the same-node local socket, 4 in flight", lambda: get_parallel(True)),
            ("block file, DiskTier.get (checksum), 1 thread", file_serial),
            ("block file, DiskTier.get, 4 threads", file_parallel),
            ("block file, bare open().read()", bare_open),
            ("bare TCP loopback: sendfile -> recv_into, no HTTP", lambda: _tcp_ceiling(paths[0], len(paths)))]
    runs = {label: [] for label, _ in ways}
    lat = {label: [] for label, _ in ways}
    for _ in range(repeat):  # round robin, so load changes on a shared machine hit every way alike
        for label, fn in ways:
            started = time.perf_counter()
            lat[label] += fn()
            runs[label].append(len(entries) * BLOCK / (time.perf_counter() - started))
    base = statistics.median(runs[ways[4][0]])
    rows = [[label, f"{statistics.median(runs[label]) / 1e6:.0f}", f"{statistics.median(runs[label]) / base:.2f}x",
             f"{statistics.median(lat[label]) * 1e3:.2f}", f"{_pct(lat[label], 0.99) * 1e3:.2f}"]
            for label, _ in ways]
    io.run(http.close())
    io.close()
    tier.close()
    client.close()
    return rows


def aggregate(plane: Embedded, readers: int, repeat: int) -> list[str]:
    """Part 2: ``readers`` threads read every block over HTTP; returns one table row."""
    client = _source(plane)
    assert warmup(client).ok
    entries = list(client.manifest)
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        threads = [threading.Thread(target=lambda mine=entries[i::readers]: [client.source.get(e, 0) for e in mine])
                   for i in range(readers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        runs.append(len(entries) * BLOCK / (time.perf_counter() - started))
    client.close()
    return [f"{statistics.median(runs) / 1e6:.0f}", f"{min(runs) / 1e6:.0f}-{max(runs) / 1e6:.0f}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--files", type=int, default=48, help="4 MiB files in the dataset")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--readers", type=int, default=8)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="datacache-bench-") as tmp:
        src, home = os.path.join(tmp, "src"), os.path.join(tmp, "home")
        os.makedirs(src)
        for i in range(args.files):
            with open(os.path.join(src, f"f{i:03d}.bin"), "wb") as f:
                f.write(os.urandom(BLOCK))
        plane = _apply(home, src)
        print(f"{args.files} blocks of 4 MiB, all cached; {os.cpu_count()} CPUs; median of {args.repeat} runs\n")
        procs = _start_workers(home, 1)
        try:
            rows = single_block(plane, args.repeat)
        finally:
            _stop(procs)
        print(format_table(["4 MiB cached blocks, 1 worker", "MB/s", "vs file", "p50 ms", "p99 ms"], rows,
                           right=[1, 2, 3, 4]))
        agg = []
        for n in (1, 2, 3):
            procs = _start_workers(home, n)
            try:
                agg.append([str(n), *aggregate(plane, args.readers, args.repeat)])
            finally:
                _stop(procs)
        print()
        print(format_table([f"workers ({args.readers} reader threads, HTTP)", "MB/s", "range"], agg, right=[1, 2]))
        plane.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
