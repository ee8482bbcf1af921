"""A cache that knows the training order (issue 21): epochs with a plan, without (LRU), and from a
local copy, side by side in one run; then record and replay.

Run from the repository root::

    python -m benchmarks.ordered --quick      # ~2 minutes on 2 shared cores
    python -m benchmarks.ordered              # 2,000 files

Set-up: an ImageNet-style JPEG tree (``datacache.demo.sample_data.make_jpeg_tree``, 22-285 KB
files) served by nginx (``--source http``, the default) or moto's S3 (``--source s3``) behind
``benchmarks.proxy.DelayProxy`` (``--latency-ms`` first byte, ``--bandwidth-mbps`` per
connection), a dataset over it whose SSD quota is half the tree's bytes (the tree is 2x the quota;
4 MiB blocks, so a file is one block). ``--readers`` reader processes (``datacache://`` clients,
persistent over the epochs as DataLoader workers with ``persistent_workers``) each read every
``readers``-th file of the epoch's order, with ``--step-ms`` of compute per file (a training
step); every epoch is a fresh shuffle. moto spends milliseconds of CPU per request, which on 2
cores caps what it delivers below what four readers consume; nginx does not.

Variants, each on a fresh cache: **plan** (the epoch's order is published before the epoch:
``datacache.stack.plans.publish_plan``, as ``OrderedPrefetch`` does), **lru** (no plan: today's
cache), **local** (the same readers over a local copy of the tree, plain ``open``). Per epoch:
wall time (from the orders handed out to the last reader done) and the cache hit ratio (blocks
found cached by readers' reads, ``HitStats``), against the Belady bound: the hit ratio of an
offline optimal cache (evict the file needed furthest ahead) of the high-watermark bytes over the
same sequence of epochs, computed here.

Replay: a job reading a fixed 30 % of the files (fits below the low watermark) runs with
``record=RUN`` on a fresh cache; the cache is emptied, ``warmup --from-trace RUN`` loads what it
read, and the same job runs again: its hit ratio and the bytes warmed against the bytes traced.

The figures depend on the machine's load (two CPUs shared by the readers, the prefetching process,
the proxy and the source); read them as ratios. The default run on 2026-12-02, quiet machine
(2,000 files, 200 MB, quota 100 MB, nginx source): epoch time with the plan 1.16x / 1.11x / 1.10x
the local copy's (10.2 s), LRU 2.46x / 2.31x / 2.32x (the plan 2.11x / 2.08x / 2.11x faster); hit
ratio with the plan 0.985 / 0.984 / 0.986, LRU 0.000 / 0.100 / 0.108, Belady bound 0.000 / 0.489
/ 0.475; UFS bytes per epoch 200 / 126 / 126 MB against 200 / 181 / 178 MB. Replay: 61.0 MB
traced, 61.0 MB warmed, second run hit ratio 1.000. A ``--quick`` run the same day
(300 files, 31 MB, quota 15.5 MB, nginx source), after the UFS mounts open when a plan is first
followed: epoch time with the plan 1.32x / 1.08x / 1.08x the local copy's, without it (LRU) 2.71x
/ 2.29x / 2.25x (the plan 2.05x / 2.12x / 2.09x faster); hit ratio with the plan 0.99 / 0.99 /
0.99, LRU 0.01 / 0.10 / 0.08, Belady bound 0.00 / 0.46 / 0.48; UFS bytes per epoch 31 / 24 / 24 MB
against 31 / 28 / 29 MB. Replay: 9.9 MB traced, 9.9 MB warmed, second run hit ratio 1.000. The
first epoch carries each reader process's one-time start (its dataset client, the plan's cursor,
the UFS client's import: its first read takes ~0.35 s of a 1.5 s epoch); later epochs' first
reads take 0.02-0.04 s. An epoch read all from the cache takes ~1.05x the local copy's: the rest
is the CPU the prefetch and the proxy take from the readers on 2 cores. Earlier --quick runs that
day, before the mounts opened with the plan: the plan 1.18-1.29x / 1.05-1.30x / 1.13-1.18x, 1.87-2.12x
faster than LRU; before the window counted the age of the positions it goes by (2026-12-01, moto
source, loaded): the plan 1.9-3.8x the local copy, 1.3-1.7x faster than LRU.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import multiprocessing
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass

from benchmarks.common import format_table
from benchmarks.nginx import NginxServer
from benchmarks.proxy import DelayProxy

DATASET = "imagenet"
BUCKET = "ordered-bench"
HIGH = 0.95  # the runtime's high watermark (the default)


@dataclass
class Epoch:
    """One epoch of one variant: wall ``seconds``, readers' block ``hits``/``misses``, bytes
    the readers' processes read from the UFS (``ufs_bytes``: demand reads and prefetch)."""

    seconds: float
    hits: int = 0
    misses: int = 0
    ufs_bytes: int = 0

    @property
    def ratio(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


def belady_hits(epochs: list[list[str]], sizes: dict[str, int], capacity: int) -> list[float]:
    """Per epoch, the hit ratio of Belady's MIN over the concatenated ``epochs`` (file paths) for
    a cache of ``capacity`` bytes: on a miss the file is kept if room can be made by evicting
    files needed later than it (furthest first); else it is not kept (bypassed)."""
    seq = [p for order in epochs for p in order]
    nxt, last = [0] * len(seq), {}
    for i in range(len(seq) - 1, -1, -1):
        nxt[i] = last.get(seq[i], len(seq) + i + 1)  # never again: further than anything, later ones further
        last[seq[i]] = i
    held: dict[str, int] = {}  # path -> its next use
    used, hits, out, start = 0, 0, [], 0
    for i, p in enumerate(seq):
        if p in held:
            hits += 1
            held[p] = nxt[i]
        elif sizes[p] <= capacity:
            while used + sizes[p] > capacity:
                victim = max(held, key=held.get)
                if held[victim] <= nxt[i]:  # all held are needed sooner than p: p is not kept
                    break
                used -= sizes[victim]
                del held[victim]
            if used + sizes[p] <= capacity:
                held[p] = nxt[i]
                used += sizes[p]
        if i - start + 1 == len(epochs[len(out)]):
            out.append(hits / len(epochs[len(out)]))
            hits, start = 0, i + 1
    return out


def _reader(conn, home: str, local_root: str | None, record: str | None, step_s: float,
            sums: dict[str, str]) -> None:
    """A reader process: for each order received, read its files in order (``datacache://``, or
    ``local_root`` files with ``open``), check their SHA-256, sleep ``step_s`` per file; reply
    with ``(files whose bytes were wrong, bytes read from the UFS so far)``. None ends it."""
    fs = None
    if local_root is None:
        from datacache.fs import DatacacheFileSystem

        fs = DatacacheFileSystem(home=home, record=record, skip_instance_cache=True)

    def read(path: str) -> bytes:
        if fs is not None:
            return fs.cat_file(f"{DATASET}/{path}")
        with open(os.path.join(local_root, path), "rb") as f:
            return f.read()

    conn.send("ready")
    while (order := conn.recv()) is not None:
        bad = 0
        for path in order:
            bad += hashlib.sha256(read(path)).hexdigest() != sums[path]
            time.sleep(step_s)
        ufs = 0
        if fs is not None:
            source = fs._client(DATASET).source
            source.stats.flush()  # the epoch's hits, for the main process
            ufs = source.ufs_bytes
        conn.send((bad, ufs))
    if fs is not None:
        fs.close()


class Readers:
    """``n`` reader processes (spawned, so each opens its own clients, as DataLoader workers)."""

    def __init__(self, n: int, home: str, sums: dict[str, str], step_s: float, local_root: str | None = None,
                 record: str | None = None):
        ctx = multiprocessing.get_context("spawn")
        self._procs, self._conns = [], []
        for _ in range(n):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_reader, args=(theirs, home, local_root, record, step_s, sums), daemon=True)
            proc.start()
            self._procs.append(proc)
            self._conns.append(mine)
        for conn in self._conns:
            assert conn.recv() == "ready"
        self._ufs = 0

    def epoch(self, order: list[str]) -> Epoch:
        """Hand reader ``k`` the files ``k, k + n, ...`` of ``order``; its seconds until all are
        done and the bytes read from the UFS meanwhile. Raises RuntimeError when a file's bytes
        were wrong."""
        n = len(self._conns)
        t0 = time.perf_counter()
        for k, conn in enumerate(self._conns):
            conn.send(order[k::n])
        replies = [conn.recv() for conn in self._conns]
        seconds = time.perf_counter() - t0
        if sum(bad for bad, _ in replies):
            raise RuntimeError(f"{sum(bad for bad, _ in replies)} files read with wrong bytes")
        ufs = sum(u for _, u in replies)
        epoch = Epoch(seconds, ufs_bytes=ufs - self._ufs)
        self._ufs = ufs
        return epoch

    def close(self) -> None:
        for conn in self._conns:
            conn.send(None)
        for proc in self._procs:
            proc.join(30)


class Bench:
    """The tree behind the proxy (``mount``: the Dataset's one mount), and fresh homes over it."""

    def __init__(self, work: str, mount: dict, quota: int, sums: dict[str, str], sizes: dict[str, int],
                 args):
        self.work, self.mount, self.quota = work, mount, quota
        self.sums, self.sizes, self.args = sums, sizes, args
        self._homes = 0

    def new_home(self):
        """``(home, control plane)``: a fresh home with the dataset applied and synced."""
        import json

        from datacache.api.loader import load_resources
        from datacache.control.embedded import Embedded

        self._homes += 1
        home = os.path.join(self.work, f"home-{self._homes}")
        docs = [{"apiVersion": "datacache.io/v1alpha1", "kind": "Dataset", "metadata": {"name": DATASET},
                 "spec": {"mounts": [self.mount]}},
                {"apiVersion": "datacache.io/v1alpha1", "kind": "CacheRuntime", "metadata": {"name": DATASET},
                 "spec": {"tieredstore": {"levels": [{"mediumtype": "SSD", "path": "cache",
                                                      "quota": str(self.quota)}]}}}]
        path = os.path.join(self.work, f"dataset-{self._homes}.yaml")
        with open(path, "w") as f:
            f.write("\n---\n".join(json.dumps(d) for d in docs))
        plane = Embedded(home)
        plane.apply(load_resources(path))
        plane.sync(DATASET)
        return home, plane

    def readers(self, home: str, **kwargs) -> Readers:
        return Readers(self.args.readers, home, self.sums, self.args.step_ms / 1000, **kwargs)

    def run(self, orders: list[list[str]], plan: bool) -> list[Epoch]:
        """The epochs of ``orders`` on a fresh cache, publishing each epoch's order with ``plan``."""
        from datacache.stack.plans import publish_plan

        home, plane = self.new_home()
        stats = plane.paths.hit_stats(plane.paths.bound(DATASET)[1])
        readers = self.readers(home)
        out = []
        try:
            for e, order in enumerate(orders):
                if plan:
                    publish_plan(plane.paths, DATASET, order, epoch=e)
                h0, m0 = stats.get(DATASET)
                epoch = readers.epoch(order)
                h1, m1 = stats.get(DATASET)
                epoch.hits, epoch.misses = h1 - h0, m1 - m0
                out.append(epoch)
        finally:
            readers.close()
            stats.close()
            plane.close()
        return out

    def replay(self, job: list[str]) -> dict:
        """Record ``job`` on a fresh cache, empty the cache, warm it from the trace, run it again."""
        home, plane = self.new_home()
        stats = plane.paths.hit_stats(plane.paths.bound(DATASET)[1])
        try:
            readers = self.readers(home, record="job1")
            try:
                first = readers.epoch(job)
            finally:
                readers.close()
            shutil.rmtree(os.path.join(home, "cache"))  # a new node, say: nothing cached, the trace kept
            _, result = plane.warmup(DATASET, [], trace="job1")
            readers = self.readers(home)
            try:
                h0, m0 = stats.get(DATASET)
                second = readers.epoch(job)
                h1, m1 = stats.get(DATASET)
                second.hits, second.misses = h1 - h0, m1 - m0
            finally:
                readers.close()
        finally:
            stats.close()
            plane.close()
        return {"first_s": first.seconds, "second": second, "warmed": result.loaded_bytes, "phase": result.phase,
                "traced": sum(self.sizes[p] for p in job)}


def build_tree(s3, n_files: int) -> tuple[dict[str, str], dict[str, int]]:
    """The JPEG tree in the bucket: ``(sha256 by dataset path, size by dataset path)``."""
    from datacache.demo.sample_data import make_jpeg_tree

    fs = s3.s3fs()
    fs.mkdir(BUCKET)
    sums: dict[str, str] = {}
    make_jpeg_tree(fs, f"{BUCKET}/imagenet", n_files=n_files, n_classes=20, checksums=sums)
    prefix = f"{BUCKET}/imagenet/"
    sums = {k[len(prefix):]: v for k, v in sums.items()}
    sizes = {k[len(prefix):]: int(info["size"]) for k, info in fs.find(f"{BUCKET}/imagenet", detail=True).items()}
    return sums, sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ordered", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="300 files (else 2000)")
    parser.add_argument("--files", type=int, default=None)
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--bandwidth-mbps", type=float, default=10.0, help="MB/s per connection")
    parser.add_argument("--source", choices=("http", "s3"), default="http",
                        help="nginx (default) or moto's S3, behind the delay proxy; moto's CPU time per request "
                             "caps what it delivers on 2 cores")
    parser.add_argument("--step-ms", type=float, default=20.0, help="compute per file read (a training step)")
    args = parser.parse_args(argv)
    n_files = args.files or (300 if args.quick else 2000)

    from datacache.demo.s3server import DUMMY_KEY, DUMMY_SECRET, MotoServer
    from datacache.ufs.credentials import env_name

    os.environ[env_name("bench", "key")] = DUMMY_KEY
    os.environ[env_name("bench", "secret")] = DUMMY_SECRET
    work = tempfile.mkdtemp(prefix="datacache-ordered-")
    try:
        with contextlib.ExitStack() as servers:
            s3 = servers.enter_context(MotoServer())
            sums, sizes = build_tree(s3, n_files)
            local_root = os.path.join(work, "local")
            s3.s3fs().get(f"{BUCKET}/imagenet/", local_root + "/", recursive=True)
            if args.source == "http":
                web = servers.enter_context(NginxServer(local_root))
                proxy = servers.enter_context(DelayProxy(web.url, args.latency_ms, args.bandwidth_mbps))
                mount = {"name": "web", "mountPoint": proxy.endpoint_url + "/"}
            else:
                proxy = servers.enter_context(DelayProxy(s3.endpoint_url, args.latency_ms, args.bandwidth_mbps))
                mount = {"name": "s3", "mountPoint": f"s3://{BUCKET}/imagenet",
                         "options": {"endpoint_url": proxy.endpoint_url}, "encryptOptions": [
                             {"name": "key", "valueFrom": {"secretKeyRef": {"name": "bench", "key": "key"}}},
                             {"name": "secret", "valueFrom": {"secretKeyRef": {"name": "bench", "key": "secret"}}}]}
            total = sum(sizes.values())
            quota = total // 2
            paths = sorted(sizes)
            orders = [random.Random(e).sample(paths, len(paths)) for e in range(args.epochs)]
            bound = belady_hits(orders, sizes, int(quota * HIGH))
            bench = Bench(work, mount, quota, sums, sizes, args)
            print(f"{len(paths)} files, {total / 1e6:.1f} MB, SSD quota {quota / 1e6:.1f} MB (the tree is 2x it); "
                  f"source {args.source} {proxy.describe()}; {args.readers} readers, {args.step_ms:g} ms compute "
                  f"per file", flush=True)
            readers = Readers(args.readers, "", sums, args.step_ms / 1000, local_root=local_root)
            try:
                local = [readers.epoch(order) for order in orders]
            finally:
                readers.close()
            runs = {"plan": bench.run(orders, plan=True), "lru": bench.run(orders, plan=False)}
            job = random.Random(99).sample(paths, int(0.3 * len(paths)))
            replay = bench.replay(job)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _report(local, runs, bound, replay)
    return 0


def _report(local: list[Epoch], runs: dict[str, list[Epoch]], bound: list[float], replay: dict) -> None:
    rows = []
    for e, base in enumerate(local):
        plan, lru = runs["plan"][e], runs["lru"][e]
        rows.append([str(e + 1), f"{base.seconds:.2f}", f"{plan.seconds:.2f}", f"{plan.seconds / base.seconds:.2f}x",
                     f"{lru.seconds:.2f}", f"{lru.seconds / base.seconds:.2f}x", f"{lru.seconds / plan.seconds:.2f}x",
                     f"{plan.ratio:.3f}", f"{lru.ratio:.3f}", f"{bound[e]:.3f}",
                     f"{plan.ratio / bound[e]:.2f}x" if bound[e] else "-",
                     f"{plan.ufs_bytes / 1e6:.1f}", f"{lru.ufs_bytes / 1e6:.1f}"])
    print(format_table(["epoch", "local s", "plan s", "plan/local", "lru s", "lru/local", "lru/plan",
                        "hit plan", "hit lru", "Belady bound", "plan/bound", "UFS MB plan", "UFS MB lru"], rows,
                       right=range(13)))
    second = replay["second"]
    print(f"replay: a job reading 30 % of the files ({replay['traced'] / 1e6:.1f} MB traced): first run "
          f"{replay['first_s']:.2f} s cold; warmup --from-trace loaded {replay['warmed'] / 1e6:.1f} MB "
          f"({replay['phase']}); second run {second.seconds:.2f} s, cache hit ratio {second.ratio:.3f}")


if __name__ == "__main__":
    raise SystemExit(main())
