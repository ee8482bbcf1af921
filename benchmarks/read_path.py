"""Read path benchmark: warm reads through ``datacache://`` and warmup, side by side with peers.

Run from the repository root::

    python -m benchmarks.read_path [--files 2000] [--shard-mib 256] [--repeat 3] [--stat median]
                                   [--latency-ms [20]] [--bandwidth-mbps [100]]

On the demo dataset (``datacache.demo``: a JPEG tree and a WebDataset tar shard in a moto S3
bucket on loopback) it measures, in one run:

Warm reads (data already cached / copied; the same read sizes on every side):

- ``local copy``: the same files copied once to a local directory (written in 4 MiB writes), read
  with ``open()``/``read()`` (page cache warm: one untimed pass first) - the ceiling;
- ``simplecache::s3://``: fsspec's whole-file cache over s3fs, filled by one untimed pass;
- ``SSD tier block files, raw read()``: the block files the SSD-only runtime's warmup wrote for the
  same files, read in order with ``os.read`` (no checksum, no reader, no index): what the cache's
  on-disk layout delivers from the page cache here, the ceiling ``datacache://`` works under. A file
  written in one large write is cached in large page-cache folios; once the kernel has paged it out
  and read it back (this VM's DAMON pages out idle memory), small files like 4 MiB blocks come back
  in small folios that copy slower, where one long file read sequentially ramps up to large ones;
- ``datacache://`` after ``Embedded.warmup``, through ``fsspec.filesystem("datacache")``, for the
  demo's default CacheRuntime (MEM 256Mi + SSD 2Gi) and an SSD-only one. MEM is per process, so
  with the default runtime the first pass of a new client is served by SSD (and promotes blocks
  into MEM), and later passes of the same client by MEM where the workload fits in it: both are
  shown.

JPEGs are read whole (``cat_file``; ``open().read()`` locally); the shard with ``open()`` and
``read(CHUNK)`` until EOF, CHUNK being the same for every system (``--chunk-kib``).

Warmup: ``Embedded.warmup`` of the JPEG tree and of the shard into an empty cache, against s3fs
copying the same files one after another (``get_file``, one GET per file: ``max_concurrency=1``)
from the same moto server. moto reads the whole object for every ranged GET, so datacache's
segmented reads of the shard (several ranged GETs) cost moto more than the single GET of the copy:
the warmup figures bound what moto can serve on this machine, not what a real object store would.
With ``--latency-ms`` and/or ``--bandwidth-mbps`` every S3 client (datacache's UFS, the s3fs copy,
simplecache's fill) reaches moto through ``benchmarks.proxy.DelayProxy``, which adds that first-byte
latency to every request and paces every connection to that bandwidth: a store that behaves like
a remote one, where a sequential copy pays the latency once per file and the bandwidth limit once
per connection. Warm reads never reach S3, so only the warmup rows (and untimed fill passes) change.

Every system gets one untimed pass first that checks sha256 of every file it read against the
generator's checksums; then ``--repeat`` rounds of one timed pass per system, interleaved, so that
drift in the machine's state hits every system alike. Every figure is measured here (the median or
the best of the ``--repeat`` passes, as ``--stat`` says). During each timed read pass the moto
server's CPU time is watched: a warm pass that made it work is flagged.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import inspect
import io
import os
import pstats
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import fsspec

from benchmarks.common import (
    DATASET,
    MB,
    DemoEnvironment,
    Sample,
    format_table,
    peak_rss_mib,
    spread,
    summarize,
    timed,
)
from datacache.cache.blocks import block_count
from datacache.control.embedded import Embedded
from datacache.warmup import warmup as dataload_warmup

RUNTIMES = ("default", "ssd-only")
LOCAL_COPY_WRITE = 4 << 20  # write size used to make the plain local copy


@dataclass
class Workload:
    name: str
    prefix: str  # dataset path prefix (under the S3 mount)
    suffix: str
    whole: bool  # read whole files (cat_file) rather than open + read(chunk)
    local_goal: float  # datacache:// warm >= this x the local copy
    paths: list[str] = field(default_factory=list)

    @property
    def target(self) -> str:
        """The warmup target (a directory of the dataset)."""
        return self.prefix.rstrip("/")


@dataclass
class Result:
    """Measured passes of one (workload, system)."""

    kind: str  # "read" | "warmup"
    workload: str
    system: str
    samples: list[Sample]
    role: str = "subject"  # "local" | "peer" | "subject"
    note: str = ""


#: A pass over a workload: ``reader(verify)`` returns ``(bytes, files)``; ``verify`` checks sha256.
Reader = Callable[[bool], tuple[int, int]]


@dataclass
class ReadSystem:
    """One system in the warm-read comparison. ``setup(system)`` returns a reader, opening any
    client outside the clock; ``fresh``: set up again (a new client) before every timed pass."""

    name: str
    role: str
    setup: Callable[[ReadSystem], Reader]
    fresh: bool = False
    note: Callable[[object], str] | None = None
    cleanup: Callable[[], None] | None = None
    prime_label: str = ""
    prime_seconds: float = 0.0
    fs: object = None  # a datacache:// filesystem to close, set by setup

    def close(self) -> None:
        if self.fs is not None:
            self.fs.close()
            self.fs = None


# -- readers -------------------------------------------------------------------------------------


def make_reader(paths: list[str], names: list[str], whole: bool, chunk: int, sums: dict[str, str],
                cat: Callable[[str], bytes], open_: Callable[[str], io.IOBase]) -> Reader:
    """A pass over ``names`` (the systems' spelling of dataset ``paths``); ``reader(verify)``
    returns ``(bytes, files)`` and with ``verify`` checks every file's sha256."""

    def read_pass(verify: bool = False) -> tuple[int, int]:
        total = 0
        for path, name in zip(paths, names, strict=True):
            if whole:
                data = cat(name)
                total += len(data)
                if verify and hashlib.sha256(data).hexdigest() != sums[path]:
                    raise AssertionError(f"{name}: sha256 mismatch")
                continue
            h = hashlib.sha256() if verify else None
            with open_(name) as f:
                while True:
                    block = f.read(chunk)
                    if not block:
                        break
                    total += len(block)
                    if h is not None:
                        h.update(block)
            if h is not None and h.hexdigest() != sums[path]:
                raise AssertionError(f"{name}: sha256 mismatch")
        return total, len(paths)

    return read_pass


def _local_cat(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def local_reader(env: DemoEnvironment, wl: Workload, root: str, chunk: int) -> Reader:
    names = [os.path.join(root, *p.split("/")) for p in wl.paths]
    return make_reader(wl.paths, names, wl.whole, chunk, env.sums, _local_cat, lambda n: open(n, "rb"))


def fsspec_reader(env: DemoEnvironment, wl: Workload, fs, names: list[str], chunk: int) -> Reader:
    return make_reader(wl.paths, names, wl.whole, chunk, env.sums, fs.cat_file, lambda n: fs.open(n, "rb"))


class _ChainedFiles:
    """``read(n)`` over the files ``paths`` one after another (raw, unbuffered), as a context manager."""

    def __init__(self, paths: list[str]):
        self._paths = iter(paths)
        self._fd: int | None = None

    def read(self, n: int) -> bytes:
        while True:
            if self._fd is None:
                path = next(self._paths, None)
                if path is None:
                    return b""
                self._fd = os.open(path, os.O_RDONLY)
            data = os.read(self._fd, n)
            if data:
                return data
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> _ChainedFiles:
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.close(self._fd)


def block_file_reader(env: DemoEnvironment, wl: Workload, home: str, chunk: int) -> Reader:
    """``wl``'s files as the SSD tier of the runtime at ``home`` stores them, read raw: each file is
    its version's cache file, which holds every block at its offset once warmed up (found once,
    here, through the dataset's block source)."""
    plane = Embedded(home)
    try:
        client = plane.open_dataset(DATASET, "default")
        try:
            blocks = {}
            for p in wl.paths:
                entry = client.stat(p)
                keys = [str(client.source.key(entry, i)) for i in range(block_count(entry.size, client.block_size))]
                blocks[p] = list(dict.fromkeys(client.source.store.block_file(k) for k in keys))  # one file
        finally:
            client.close()
    finally:
        plane.close()
    if any(f is None for files in blocks.values() for f in files):
        raise RuntimeError(f"{wl.name}: a block is missing from the SSD tier at {home} after its warmup")

    def cat(p: str) -> bytes:
        files = blocks[p]
        return _local_cat(files[0]) if len(files) == 1 else b"".join(map(_local_cat, files))

    return make_reader(wl.paths, wl.paths, wl.whole, chunk, env.sums, cat, lambda p: _ChainedFiles(blocks[p]))


def datacache_fs(home: str):
    """A fresh ``datacache://`` filesystem over ``home`` (fsspec's instance cache skipped)."""
    return fsspec.filesystem("datacache", home=home, skip_instance_cache=True)


def dataset_names(wl: Workload) -> list[str]:
    return [f"{DATASET}/{p}" for p in wl.paths]


# -- the benchmark -------------------------------------------------------------------------------

class ReadPathBench:
    def __init__(self, env: DemoEnvironment, workloads: list[Workload], repeat: int, stat: str, chunk: int,
                 log: Callable[[str], None]):
        self.env = env
        self.workloads = workloads
        self.repeat = repeat
        self.stat = stat
        self.chunk = chunk
        self.log = log
        self.results: list[Result] = []
        self.homes: dict[str, str] = {}
        self.s3fs_copy = ""  # the last sequential s3fs copy
        self.local_copy = ""  # the plain local copy (see make_local_copy)

    # -- warmup vs sequential s3fs copy ----------------------------------------------------------
    def copy_sequentially(self, fs, wl: Workload, dest: str) -> tuple[int, int]:
        """s3fs ``get_file`` of each file, one after another, one GET each; returns (bytes, files)."""
        total = 0
        for p in wl.paths:
            local = os.path.join(dest, *p.split("/"))
            os.makedirs(os.path.dirname(local), exist_ok=True)
            fs.get_file(self.env.s3_key(p), local)
            total += os.path.getsize(local)
        return total, len(wl.paths)

    def run_warmups(self) -> None:
        env = self.env
        pid = env.s3.pid if env.s3 is not None else None
        copies: dict[str, list[Sample]] = {wl.name: [] for wl in self.workloads}
        warms: dict[tuple[str, str], list[Sample]] = {}
        engine: dict[tuple[str, str], list[str]] = {}
        old_homes: list[str] = []
        for k in range(self.repeat):
            dest = env.path(f"copy-{k}")
            # A new s3fs client per pass, its connection set up before the clock starts (datacache's
            # UFS client is set up by the metadata sync that applying the Dataset runs).
            fs = env.s3fs(max_concurrency=1)
            fs.info(env.s3_key(self.workloads[0].paths[0]))
            for wl in self.workloads:
                s = timed(lambda fs=fs, wl=wl, dest=dest: self.copy_sequentially(fs, wl, dest), server_pid=pid)
                copies[wl.name].append(s)
                self.log(f"    pass {k + 1}: s3fs sequential copy, {wl.name}: {s.seconds:.2f}s, {s.mb_s:.0f} MB/s")
            if self.s3fs_copy:
                shutil.rmtree(self.s3fs_copy, ignore_errors=True)
            self.s3fs_copy = dest
            for rt in RUNTIMES:
                home, plane = env.new_home(rt)
                try:
                    for wl in self.workloads:
                        out = {}

                        def run(plane=plane, wl=wl, out=out):
                            _, result = plane.warmup(DATASET, [wl.target])
                            out["result"] = result
                            return result.targets[0].bytes, result.targets[0].files

                        s = timed(run, server_pid=pid)
                        result = out["result"]
                        target = result.targets[0]
                        if not result.ok or target.files != len(wl.paths):
                            raise RuntimeError(f"warmup of {wl.target} ({rt}) did not complete: phase "
                                               f"{target.phase}, {target.files} files, {target.failures[:3]}")
                        warms.setdefault((wl.name, rt), []).append(s)
                        engine.setdefault((wl.name, rt), []).append(
                            f"engine {result.duration:.2f}s, {result.loaded_bytes / MB:.0f} MB from the UFS")
                        self.log(f"    pass {k + 1}: datacache warmup ({rt}), {wl.name}: {s.seconds:.2f}s, "
                                 f"{s.mb_s:.0f} MB/s")
                finally:
                    plane.close()
                if rt in self.homes:
                    old_homes.append(self.homes[rt])
                self.homes[rt] = home
            for h in old_homes:
                shutil.rmtree(h, ignore_errors=True)
            old_homes.clear()
        for wl in self.workloads:
            samples = copies[wl.name]
            self.results.append(Result("warmup", wl.name, "s3fs get_file, sequential", samples, role="peer",
                                       note=_cpu_note(summarize(samples, self.stat))))
            for rt in RUNTIMES:
                samples = warms[(wl.name, rt)]
                chosen = summarize(samples, self.stat)
                extra = engine[(wl.name, rt)][samples.index(chosen)]
                self.results.append(Result("warmup", wl.name, f"datacache warmup [{env.runtime_label(rt)}]",
                                           samples, note=f"{_cpu_note(chosen)}; {extra}"))

    # -- warm reads ------------------------------------------------------------------------------
    def make_local_copy(self) -> None:
        """The plain local copy: every file of the last sequential s3fs copy copied again, in 4 MiB
        writes. Not that copy itself: s3fs writes in 64 KiB pieces, and on this machine's kernel a
        file written in small pieces reads measurably slower from the page cache (smaller page-cache
        folios) than one written in large writes, which would lower the ceiling."""
        dest = self.env.path("local-copy")
        for wl in self.workloads:
            for p in wl.paths:
                dst = os.path.join(dest, *p.split("/"))
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                with open(os.path.join(self.s3fs_copy, *p.split("/")), "rb") as fi, open(dst, "wb") as fo:
                    shutil.copyfileobj(fi, fo, LOCAL_COPY_WRITE)
        shutil.rmtree(self.s3fs_copy, ignore_errors=True)
        self.local_copy = dest

    def _timed_read(self, reader: Reader) -> Sample:
        """One timed warm pass; the S3 server's CPU is watched to prove it was not asked."""
        return timed(lambda: reader(False), server_pid=self.env.s3.pid if self.env.s3 else None)

    def read_systems(self, wl: Workload) -> list[ReadSystem]:
        env, chunk = self.env, self.chunk
        names = dataset_names(wl)
        systems = [
            ReadSystem("local copy, open()/read()", "local",
                       lambda _: local_reader(env, wl, self.local_copy, chunk)),
        ]
        sc_dir = env.path(f"simplecache-{wl.name.replace(' ', '-')}")

        def simplecache(_: ReadSystem) -> Reader:
            fs = fsspec.filesystem("simplecache", target_protocol="s3", target_options=env.storage_options(),
                                   cache_storage=sc_dir, skip_instance_cache=True)
            return fsspec_reader(env, wl, fs, [env.s3_key(p) for p in wl.paths], chunk)

        systems.append(ReadSystem("simplecache::s3:// warm", "peer", simplecache,
                                  cleanup=lambda: shutil.rmtree(sc_dir, ignore_errors=True),
                                  prime_label="fill pass"))
        systems.append(ReadSystem("SSD tier block files, raw read()", "layout",
                                  lambda _: block_file_reader(env, wl, self.homes["ssd-only"], chunk)))
        for rt in RUNTIMES:
            label, home = env.runtime_label(rt), self.homes[rt]

            def datacache(system: ReadSystem, home: str = home) -> Reader:
                system.fs = datacache_fs(home)
                system.fs.info(names[0])  # opens the dataset client outside the timing
                return fsspec_reader(env, wl, system.fs, names, chunk)

            if "MEM" in label:
                # MEM is per process: a new client's first pass is served by SSD (and promotes
                # blocks into MEM); a client's later passes by MEM where the workload fits.
                systems.append(ReadSystem(f"datacache:// [{label}] 1st pass, new client", "subject", datacache,
                                          fresh=True))
                name = f"datacache:// [{label}] re-read"
            else:
                name = f"datacache:// [{label}]"
            systems.append(ReadSystem(name, "subject", datacache, note=_mem_hit_note))
        return systems

    def run_reads(self, wl: Workload) -> None:
        """Prime every system once (untimed, sha256-checked), then ``repeat`` rounds of one timed pass
        per system, interleaved so drift in the machine's state hits every system alike."""
        systems = self.read_systems(wl)
        samples: dict[str, list[Sample]] = {s.name: [] for s in systems}
        readers: dict[str, Reader] = {}
        try:
            for sysm in systems:
                readers[sysm.name] = sysm.setup(sysm)
                t0 = time.perf_counter()
                readers[sysm.name](True)
                sysm.prime_seconds = time.perf_counter() - t0
            for _ in range(self.repeat):
                for sysm in systems:
                    if sysm.fresh:
                        sysm.close()
                        readers[sysm.name] = sysm.setup(sysm)
                    samples[sysm.name].append(self._timed_read(readers[sysm.name]))
            for sysm in systems:
                notes = [sysm.note(sysm.fs) if sysm.note and sysm.fs is not None else ""]
                if sysm.prime_label:
                    notes.append(f"{sysm.prime_label} {sysm.prime_seconds:.1f}s")
                busy = max((s.server_cpu or 0.0) for s in samples[sysm.name])
                if busy > 0.05:  # a warm pass must not touch S3
                    notes.append(f"WARNING: moto used {busy:.2f}s CPU during a timed pass")
                self.results.append(Result("read", wl.name, sysm.name, samples[sysm.name], role=sysm.role,
                                           note="; ".join(n for n in notes if n)))
                self.log(f"    {wl.name}: {sysm.name}: {spread(samples[sysm.name])} MB/s")
        finally:
            for sysm in systems:
                sysm.close()
                if sysm.cleanup is not None:
                    sysm.cleanup()

    def profile(self, wl: Workload, top: int) -> None:
        """cProfile one warm pass of each datacache:// system over ``wl``; print the top entries."""
        for rt in RUNTIMES:
            fs = datacache_fs(self.homes[rt])
            try:
                fs.info(dataset_names(wl)[0])
                reader = fsspec_reader(self.env, wl, fs, dataset_names(wl), self.chunk)
                reader(False)  # same state as the re-read rows
                prof = cProfile.Profile()
                prof.enable()
                reader(False)
                prof.disable()
            finally:
                fs.close()
            out = io.StringIO()
            st = pstats.Stats(prof, stream=out)
            st.sort_stats("tottime").print_stats(top)
            print(f"\n--- cProfile: warm {wl.name} pass, datacache:// [{self.env.runtime_label(rt)}], "
                  f"top {top} by own time ---")
            print(_trim_pstats(out.getvalue()))


def _cpu_note(s: Sample) -> str:
    """Where the CPU went in one timed pass (the machine's cores bound what parallelism can buy)."""
    server = f" + moto {s.server_cpu:.2f}s" if s.server_cpu is not None else ""
    busy = (s.cpu + (s.server_cpu or 0.0)) / s.seconds if s.seconds else 0.0
    return f"reported pass {s.seconds:.2f}s wall, CPU this process {s.cpu:.2f}s{server} ({busy:.1f} cores busy)"


def _mem_hit_note(fs) -> str:
    """How the dataset client's MEM tier fared (evictions), if it has one."""
    notes = []
    for client in getattr(fs, "_clients", {}).values():
        store = client.source.store
        for lv in store.levels:
            if lv.medium == "MEM":
                notes.append(f"MEM evictions {lv.evictions}")
            elif hasattr(lv, "corrupt") and lv.corrupt:
                notes.append(f"corrupt blocks {lv.corrupt}")
    return "; ".join(notes)


def _trim_pstats(text: str) -> str:
    lines = text.strip("\n").splitlines()
    start = next((i for i, ln in enumerate(lines) if "ncalls" in ln), 0)
    head = [ln for ln in lines[:start] if "function calls" in ln]
    return "\n".join(head + lines[start:])


# -- the table -----------------------------------------------------------------------------------

def build_rows(results: list[Result], workloads: list[Workload], stat: str,
               warmup_goal: float) -> tuple[list[list[str]], list[bool]]:
    """Table rows (read rows first, then warmup rows) and one verdict per row that has a goal."""
    rows, verdicts = [], []
    goals = {wl.name: wl.local_goal for wl in workloads}
    whole = {wl.name: wl.whole for wl in workloads}
    for kind in ("read", "warmup"):
        for wl in workloads:
            mine = [r for r in results if r.kind == kind and r.workload == wl.name]
            local = next((summarize(r.samples, stat) for r in mine if r.role == "local"), None)
            peer_r = next((r for r in mine if r.role == "peer"), None)
            peer = summarize(peer_r.samples, stat) if peer_r else None
            peer_name = "simplecache" if kind == "read" else "s3fs seq"
            for r in mine:
                s = summarize(r.samples, stat)
                vs_local = f"{s.mb_s / local.mb_s:.2f}x" if local and r.role != "local" else "-"
                vs_peer = f"{s.mb_s / peer.mb_s:.2f}x {peer_name}" if peer and r.role == "subject" else "-"
                if r.role == "local":
                    goal, met = "(ceiling)", ""
                elif r.role == "layout":
                    goal, met = "(cache layout)", ""
                elif r.role == "peer":
                    goal, met = "(peer)", ""
                elif kind == "read":
                    g = goals[r.workload]
                    ok_local, ok_peer = s.mb_s >= g * local.mb_s, s.mb_s > peer.mb_s
                    goal = f">={g:.1f}x local, >1x {peer_name}"
                    met = "yes" if ok_local and ok_peer else (
                        "no (local)" if ok_peer else "no (peer)" if ok_local else "no (both)")
                    verdicts.append(ok_local and ok_peer)
                else:
                    ok = s.mb_s >= warmup_goal * peer.mb_s
                    goal, met = f">={warmup_goal:.0f}x {peer_name}", "yes" if ok else "no"
                    verdicts.append(ok)
                label = wl.name if kind == "read" else f"warmup: {wl.name}"
                files_s = f"{s.files_s:,.0f}" if whole[r.workload] else "-"
                rows.append([label, r.system, f"{s.mb_s:,.0f}", spread(r.samples), files_s,
                             vs_local, vs_peer, goal, met])
    return rows, verdicts


# -- main ----------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.read_path", description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=2000, help="JPEGs in the tree (default 2000)")
    ap.add_argument("--shard-mib", type=int, default=256, help="tar shard size in MiB (default 256)")
    ap.add_argument("--repeat", type=int, default=3, help="timed passes per figure (default 3)")
    ap.add_argument("--stat", choices=("median", "best"), default="median",
                    help="which of the --repeat passes is reported (default median)")
    ap.add_argument("--chunk-kib", type=int, default=1024,
                    help="read size for the shard, the same for every system (default 1024 = 1 MiB)")
    ap.add_argument("--profile", action="store_true",
                    help="cProfile a warm datacache:// pass of every workload that missed a read goal")
    ap.add_argument("--latency-ms", type=float, nargs="?", const=20.0, default=None, metavar="MS",
                    help="reach S3 through a delay proxy adding MS ms first-byte latency per request "
                         "(given alone: 20)")
    ap.add_argument("--bandwidth-mbps", type=float, nargs="?", const=100.0, default=None, metavar="MBPS",
                    help="reach S3 through a delay proxy pacing each connection to MBPS MB/s "
                         "(given alone: 100)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--quiet", action="store_true", help="print only the table and the summary")
    args = ap.parse_args(argv)
    if args.files < 1 or args.shard_mib < 1 or args.repeat < 1 or args.chunk_kib < 1:
        ap.error("--files, --shard-mib, --repeat and --chunk-kib must be >= 1")
    if (args.latency_ms or 0) < 0 or (args.bandwidth_mbps or 0) < 0:
        ap.error("--latency-ms and --bandwidth-mbps must be >= 0")

    log = (lambda s: None) if args.quiet else (lambda s: print(s, flush=True))
    chunk = args.chunk_kib << 10
    warmup_goal = 4.0
    t_start = time.perf_counter()
    workloads = [
        Workload("JPEG tree", "s3/imagenet/", ".JPEG", whole=True, local_goal=0.5),
        Workload("tar shard", "s3/shards/", ".tar", whole=False, local_goal=0.8),
    ]
    log(f"==> building the demo dataset ({args.files} JPEGs, a {args.shard_mib} MiB shard) on moto S3, loopback")
    with DemoEnvironment(n_jpeg=args.files, shard_bytes=args.shard_mib << 20, keep=args.keep,
                         latency_ms=args.latency_ms, bandwidth_mbps=args.bandwidth_mbps) as env:
        for wl in workloads:
            wl.paths = env.files(wl.prefix, wl.suffix)
        log(f"    built in {env.build_seconds:.1f}s in {env.work}")
        proxy_label = env.proxy.describe() if env.proxy is not None else ""
        if proxy_label:
            log(f"    S3 clients go through a delay proxy ({proxy_label}) at {env.endpoint_url}")
        rss_marks = [("dataset built", peak_rss_mib()[0])]
        bench = ReadPathBench(env, workloads, args.repeat, args.stat, chunk, log)
        log(f"==> warmup vs sequential s3fs copy ({args.repeat} passes each, fresh cache every pass)")
        bench.run_warmups()
        bench.make_local_copy()
        rss_marks.append(("warmups", peak_rss_mib()[0]))
        for wl in workloads:
            log(f"==> warm reads: {wl.name}")
            bench.run_reads(wl)
            rss_marks.append((f"{wl.name} reads", peak_rss_mib()[0]))
        rows, verdicts = build_rows(bench.results, workloads, args.stat, warmup_goal)
        if args.profile:
            missed = {row[0] for row in rows if row[-1].startswith("no") and not row[0].startswith("warmup")}
            for wl in workloads:
                if wl.name in missed:
                    bench.profile(wl, 14)
        labels = {rt: env.runtime_label(rt) for rt in RUNTIMES}
        block = env.block_size()
        sizes = {wl.name: (len(wl.paths), env.total_bytes(wl.paths)) for wl in workloads}
        notes = [(r.workload, r.kind, r.system, r.note) for r in bench.results if r.note]
        work = env.work
    elapsed = time.perf_counter() - t_start
    own, children = peak_rss_mib()

    print()
    print(f"datacache read path benchmark - {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
          f"fsspec {fsspec.__version__}")
    print("dataset: " + "; ".join(f"{name}: {n} file{'s' if n != 1 else ''}, {b / MB:,.1f} MB"
                                  for name, (n, b) in sizes.items()))
    print(f"runtimes: default [{labels['default']}], ssd-only [{labels['ssd-only']}]; blockSize {block}; "
          f"JPEGs read whole (cat_file / open().read()); shard read in {chunk >> 10} KiB chunks on every system")
    print(f"figures: {args.stat} of {args.repeat} timed pass(es); 'runs' = min-max MB/s over the passes; "
          f"MB = 10^6 bytes")
    if proxy_label:
        print(f"S3: moto on loopback behind a delay proxy (benchmarks/proxy.py): {proxy_label}; "
              "every S3 client goes through it")
    print()
    headers = ["workload", "system", "MB/s", "runs", "files/s", "vs local", "vs peer", "goal", "met"]
    print(format_table(headers, rows, right={2, 3, 4, 5, 6}))
    print()
    for workload, kind, system, note in notes:
        print(f"  note: {kind} {workload}, {system}: {note}")
    segment = inspect.signature(dataload_warmup).parameters["segment_bytes"].default
    print("  warmup: both sides read the same moto S3 server on loopback (moto reads a whole object for "
          f"every ranged GET,\n  so datacache's {segment >> 20} MiB ranged segments of the shard each cost moto "
          "a full read; the s3fs copy is one GET per file).")
    if proxy_label:
        print(f"  warmup: both sides reach moto through the same delay proxy ({proxy_label}); the proxy "
              "is one Python process,\n  so its own CPU (one core at most) bounds the aggregate of parallel "
              "connections.")
    print(f"  goals met: {sum(verdicts)}/{len(verdicts)}")
    print(f"total time {elapsed:.1f}s; peak RSS: this process {own:,.0f} MiB, "
          f"moto server (reaped child) {children:,.0f} MiB")
    print("  this process's peak RSS after each phase: "
          + ", ".join(f"{name} {mib:,.0f} MiB" for name, mib in rss_marks))
    if args.keep:
        print(f"temporary directory kept: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
