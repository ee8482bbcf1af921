"""The kernel transport's read speed, side by side with the local file system, ratios printed.

Run from the repository root, as root (it drops the page cache and mounts)::

    python -m benchmarks.kernel_transport [--size-mib 1024] [--files 2000] [--rounds 3] [--procs 4]

Data, in one temporary directory under ``--dir`` (removed at the end): one large file of random
bytes (``--size-mib``, default 1 GiB) and ``--files`` files of 100,000 bytes in folders of 100.

Systems, each mount served by a child process (``--serve``) running
:class:`datacache_fuse.kernel.mirror.MirrorOperations` over the data directory through
:class:`datacache_fuse.kernel.server.FuseServer` (4 worker threads, 1 MiB read-ahead):

- **local**: the data directory itself;
- **passthrough**: OPEN answers ``FOPEN_PASSTHROUGH`` on the local file: the kernel reads it; a
  reopen of a file passed through before, and its RELEASE, are answered by the compiled request
  loop (``OpenOut.reopen``, :mod:`datacache_fuse.kernel.fast_open`), as ``datacache mount`` does;
- **passthrough, reopens in Python** (small files only): the same with every OPEN and RELEASE
  answered by the Python handlers (``datacache`` before the compiled reopens);
- **READ path**: OPEN answers a handle, every byte crosses the daemon (``os.pread`` + ``writev``);
- **no-open**: OPEN answers ENOSYS once; the kernel then opens without asking and keeps the page
  cache; bytes cross the daemon on a page-cache miss;
- **no-open, io_uring**: the same over FUSE over io_uring (one ring queue per CPU; the fuse
  module's ``enable_uring`` is turned on for its INIT and back after).

Workloads (median of ``--rounds`` passes, sides interleaved; the ratio of the best passes is
printed beside the medians' ratio):

1. the large file with ``dd bs=1M``, page cache dropped (``sync; echo 3 > drop_caches``) before
   each side, then again at once (warm);
2. the small files: ``open()`` + one ``readinto`` + close of each, by ``--procs`` processes, page
   cache warm (each side read them once before), then with the page cache dropped;
3. reopens: the same over the first ``--reopen-files`` small files (default 32, fewer than the 64
   inodes whose reopens the compiled loop answers, :data:`~datacache_fuse.kernel.fast_open.SLOTS`),
   as many opens as there are small files, page cache warm: a few large files opened over and
   over (Parquet row groups, DLIO's samples) cost this per open.

Every side's bytes are checked once (sha256 of the large file, of every small file) before timing.
After the run each server reports the requests it received: a passthrough mount should have
received no READ.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

from benchmarks.common import MB, cpu_seconds, format_table
from benchmarks.fuse_read import drop_caches, read_paths
from datacache_fuse.kernel.ring_queue import enable_uring_while
from datacache.demo.sample_data import sha256_file as sha_file

SMALL = 100_000
PER_DIR = 100
MODES = ("passthrough", "passthrough-python", "read", "no-open", "no-open-uring")


# -- the serving child ---------------------------------------------------------------------------
def serve(src: str, mountpoint: str, mode: str, workers: int) -> None:
    """Mount ``src`` at ``mountpoint`` in ``mode``, print ``ready``, serve until SIGTERM, then
    print one JSON line: the requests received by opcode and the operations' calls."""
    from datacache_fuse.kernel.mirror import MirrorOperations
    from datacache_fuse.kernel.server import FuseServer

    logging.basicConfig(level=logging.WARNING, format="serve %(levelname)s %(message)s")
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})  # workers inherit the mask
    passthrough = mode.startswith("passthrough")
    ops = MirrorOperations(src, passthrough=passthrough, no_open=mode.startswith("no-open"), timeout=3600,
                           reopen=mode == "passthrough")
    server = FuseServer(ops, mountpoint, fsname=f"datacache:bench/{mode}", passthrough=passthrough,
                        workers=workers, uring=mode.endswith("-uring"))
    session = server.start()
    print("ready", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    ended = server.stop(timeout=10, force=True)
    counts = {getattr(k, "name", str(k)): v for k, v in session.counts().items()}
    print(json.dumps({"requests": counts, "calls": dict(ops.calls), "ended": ended,
                      "passthrough": session.passthrough, "refused": session.backing.refused}), flush=True)


class Server:
    """A ``serve`` child process; :meth:`stop` returns its report."""

    def __init__(self, src: str, mountpoint: str, mode: str, workers: int):
        os.makedirs(mountpoint, exist_ok=True)
        self.mode, self.mountpoint = mode, mountpoint
        self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks.kernel_transport", "--serve", src, mountpoint,
                                      mode, "--workers", str(workers)], stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            self.proc.kill()
            raise RuntimeError(f"the {mode} server did not start (said {line!r})")

    def stop(self) -> dict:
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=60)
        lines = out.strip().splitlines()
        return json.loads(lines[-1]) if lines else {}


# -- data and readers ----------------------------------------------------------------------------
def make_data(root: str, size: int, n_files: int) -> tuple[str, str, list[str], list[str]]:
    """``(large rel path, its sha256, small rel paths, their sha256s)`` written under ``root``."""
    large = "large.bin"
    h = hashlib.sha256()
    with open(os.path.join(root, large), "wb") as f:
        left = size
        while left:
            chunk = os.urandom(min(4 << 20, left))
            h.update(chunk)
            f.write(chunk)
            left -= len(chunk)
    rels, sums = [], []
    for i in range(n_files):
        rel = f"small/d{i // PER_DIR:03d}/f{i:05d}.bin"
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
        data = os.urandom(SMALL)
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
        rels.append(rel)
        sums.append(hashlib.sha256(data).hexdigest())
    os.sync()
    return large, h.hexdigest(), rels, sums


def dd(path: str) -> float:
    """Seconds ``dd if=path of=/dev/null bs=1M`` took."""
    t0 = time.perf_counter()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=1M"], check=True, capture_output=True)
    return time.perf_counter() - t0


def _read_slice(paths: list[str]) -> int:
    return read_paths(paths, 1 << 20)[0]


def read_files(pool: ProcessPoolExecutor, paths: list[str], procs: int) -> float:
    """Seconds to read every file of ``paths``, split over ``procs`` processes of ``pool``."""
    slices = [paths[i::procs] for i in range(procs)]
    t0 = time.perf_counter()
    total = sum(pool.map(_read_slice, slices))
    seconds = time.perf_counter() - t0
    assert total == SMALL * len(paths), f"read {total} bytes of {SMALL * len(paths)}"
    return seconds


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


# -- the run -------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> None:
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    base = tempfile.mkdtemp(prefix="kt-bench-", dir=args.dir)
    src = os.path.join(base, "src")
    os.makedirs(src)
    servers: dict[str, Server] = {}
    reports: dict[str, dict] = {}
    try:
        log(f"writing {args.size_mib} MiB + {args.files:,} x 100 KB under {src}")
        large, large_sum, rels, sums = make_data(src, args.size_mib << 20, args.files)
        roots = {"local": src}
        for mode in MODES:
            with enable_uring_while() if mode.endswith("-uring") else contextlib.nullcontext():
                servers[mode] = Server(src, os.path.join(base, f"mnt-{mode}"), mode, args.workers)
            roots[mode] = servers[mode].mountpoint
        for name, root in roots.items():  # every side's bytes, once
            if sha_file(os.path.join(root, large)) != large_sum:
                raise AssertionError(f"{name}: the large file's sha256 differs")
            read_paths([os.path.join(root, r) for r in rels], 1 << 20, sums)
        log("bytes checked on every side")

        large_sides = ("local", "passthrough", "read")
        cold = {s: [] for s in large_sides}
        warm = {s: [] for s in large_sides}
        cpu = {s: 0.0 for s in large_sides}
        size = os.path.getsize(os.path.join(src, large))
        for k in range(args.rounds):
            for side in large_sides[k % 3:] + large_sides[:k % 3]:
                pid = servers[side].proc.pid if side in servers else None
                c0 = cpu_seconds(pid) if pid else 0.0
                drop_caches()
                cold[side].append(dd(os.path.join(roots[side], large)))
                warm[side].append(dd(os.path.join(roots[side], large)))
                cpu[side] += (cpu_seconds(pid) - c0) if pid else 0.0
                log(f"  round {k + 1} {side}: dropped {size / cold[side][-1] / MB:,.0f} MB/s, "
                    f"warm {size / warm[side][-1] / MB:,.0f} MB/s")

        small_sides = ("local", "no-open", "no-open-uring", "passthrough", "passthrough-python", "read")
        n = len(small_sides)
        hot = {s: [] for s in small_sides}
        dropped = {s: [] for s in small_sides}
        again = {s: [] for s in small_sides}
        few = rels[:args.reopen_files] * max(1, len(rels) // args.reopen_files)
        with ProcessPoolExecutor(args.procs) as pool:
            for side in small_sides:  # warm every side's page and entry caches
                read_files(pool, [os.path.join(roots[side], r) for r in rels], args.procs)
            for k in range(args.rounds):
                for side in small_sides[k % n:] + small_sides[:k % n]:
                    hot[side].append(read_files(pool, [os.path.join(roots[side], r) for r in rels], args.procs))
                    again[side].append(read_files(pool, [os.path.join(roots[side], r) for r in few], args.procs))
            for k in range(args.rounds):
                for side in small_sides[k % n:] + small_sides[:k % n]:
                    drop_caches()
                    dropped[side].append(read_files(pool, [os.path.join(roots[side], r) for r in rels],
                                                    args.procs))
                    log(f"  round {k + 1} {side}: small files, hot {len(rels) / hot[side][k]:,.0f}/s, "
                        f"dropped {len(rels) / dropped[side][-1]:,.0f}/s")
    finally:
        for mode, server in servers.items():
            reports[mode] = server.stop()
        shutil.rmtree(base, ignore_errors=True)

    def cells(series: dict, sides: tuple, per: float, unit: str) -> list[str]:
        """Median rate of each side, its ratio to local's median and, in brackets, the ratio of
        the best passes (neighbours' I/O on a shared machine moves the median)."""
        base, base_best = per / median(series["local"]), per / min(series["local"])
        out = [f"{base:,.0f} {unit}"]
        for side in sides:
            r, best = per / median(series[side]), per / min(series[side])
            out.append(f"{r:,.0f} {unit} ({r / base:.2f}x; best {best / base_best:.2f}x)")
        return out

    rows = []
    for label, series in ((f"{args.size_mib:,} MiB dd bs=1M, page cache dropped", cold),
                          (f"{args.size_mib:,} MiB dd bs=1M, warm", warm)):
        rows.append([label, *cells(series, ("passthrough",), size / MB, "MB/s"), "-",
                     *cells(series, ("read",), size / MB, "MB/s")[1:], "-", "-"])
    for label, series, count in (
            (f"{len(rels):,} x 100 KB, {args.procs} procs, page cache hot", hot, len(rels)),
            (f"{len(rels):,} x 100 KB, {args.procs} procs, page cache dropped", dropped, len(rels)),
            (f"{len(few):,} opens of {args.reopen_files} x 100 KB, {args.procs} procs, hot", again, len(few))):
        rows.append([label, *cells(series, ("passthrough", "passthrough-python", "read", "no-open", "no-open-uring"),
                                   count, "files/s")])
    print(format_table(["workload", "local", "passthrough", "passthrough, reopens in Python", "READ path", "no-open",
                        "no-open, io_uring"], rows))
    print()
    for mode in MODES:
        rep = reports.get(mode, {})
        req = rep.get("requests", {})
        print(f"{mode} server: READ {req.get('READ', 0):,}, OPEN {req.get('OPEN', 0):,} "
              f"(the operations' open {rep.get('calls', {}).get('open', 0):,}), "
              f"LOOKUP {req.get('LOOKUP', 0):,} requests; passthrough {rep.get('passthrough')}, "
              f"refused {rep.get('refused')}; session ended {rep.get('ended')}")
    print(f"server CPU seconds during the large-file rounds: passthrough {cpu['passthrough']:.2f}, "
          f"READ path {cpu['read']:.2f}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mib", type=int, default=1024, help="large file size (MiB)")
    p.add_argument("--files", type=int, default=2000, help="number of 100 KB files")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--procs", type=int, default=4, help="reader processes for the small files")
    p.add_argument("--reopen-files", type=int, default=32, help="small files opened over and over (row 3)")
    p.add_argument("--workers", type=int, default=4, help="worker threads per server")
    p.add_argument("--dir", default="/var/tmp", help="where the data and mount points go (a local disk)")
    p.add_argument("--serve", nargs=3, metavar=("SRC", "MOUNTPOINT", "MODE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        serve(*args.serve, workers=args.workers)
        return
    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark drops the page cache and mounts")
    run(args)


if __name__ == "__main__":
    main()
