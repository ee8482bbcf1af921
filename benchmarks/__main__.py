"""``python -m benchmarks``: datacache side by side with its peers, on one machine, in one run.

Run from the repository root, as root (FUSE mounts; the page cache is dropped before cold epochs)::

    python -m benchmarks --quick          # about 5 minutes on 2 cores, the S3 source only
    python -m benchmarks                  # full sizes, S3 and HTTP sources (about 40 minutes);
                                          # writes benchmarks/RESULTS.md

It starts moto's S3 server on loopback (``--s3-server``: ``stored``, a ranged GET reads only its
range, as S3 does; ``moto``, stock, the whole object) behind ``benchmarks.proxy.DelayProxy`` (``--latency-ms``
first-byte latency, ``--bandwidth-mbps`` per connection: a remote object store), builds the
dataset into the bucket (``datacache.demo.sample_data``: an ImageNet-style JPEG tree, a WebDataset tar
shard, Parquet files with several row groups) and, for the ``http`` source (``--sources``), serves
the same files with nginx (real range support) behind a second proxy with the same settings. For
each source it runs every system of ``benchmarks.systems`` through the workloads of
``benchmarks.peers`` and writes ``RESULTS.md`` (machine, date, settings, the
ratio table, the memory table) and ``RESULTS.png`` (the chart) into ``--out``. Every system's
bytes are checked against the generator's checksums. Each step of a system (set-up, each workload)
has ``--system-timeout`` seconds: past it the system is reported as "timed out after N s in
<step>", its processes and mounts are ended, and the run goes on (``benchmarks.peers``). Exit
status: 0, or 1 when a system that is installed failed or timed out.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from benchmarks.common import DemoEnvironment
from benchmarks.fuse_read import Mounts
from benchmarks.juicefs import juicefs_binary
from benchmarks.peers import SETTLE_S, Outcome, PeerBench
from benchmarks.report import chart, markdown_table, memory_rows, ratio_rows
from benchmarks.systems import SOURCES, SYSTEMS, make_systems
from datacache.demo.s3server import RANGES

#: (quick, full) defaults of the size options
SIZES = {
    "files": (200, 1500),
    "shard_mib": (32, 256),
    "parquet_files": (2, 3),
    "parquet_rows": (40_000, 200_000),
    "row_group_rows": (10_000, 25_000),
    "parquet_reads": (30, 100),
    # A full run's warm epoch (1,500 files) and shard read pass last 0.03-0.2 s each: with the
    # median of 3, two runs of 2026-12-04 on one machine put the same row at 0.51x and 0.67x of
    # the best peer; 9 passes add 6 such passes per workload and system.
    "repeat": (3, 9),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: about 5 minutes on 2 cores")
    for name, (quick, full) in SIZES.items():
        ap.add_argument(f"--{name.replace('_', '-')}", type=int, default=None,
                        help=f"default {full:,} ({quick:,} with --quick)")
    ap.add_argument("--workers", type=int, default=4, help="reader processes (DataLoader num_workers; default 4)")
    ap.add_argument("--latency-ms", type=float, default=20.0, help="first-byte latency the proxy adds (default 20)")
    ap.add_argument("--bandwidth-mbps", type=float, default=100.0,
                    help="MB/s per connection through the proxy, 0: unlimited (default 100)")
    ap.add_argument("--systems", default=",".join(SYSTEMS),
                    help=f"comma-separated, the local copy first (default: all: {','.join(SYSTEMS)})")
    ap.add_argument("--sources", default=None,
                    help=f"comma-separated, of {','.join(SOURCES)} (default: both; s3 with --quick, "
                         "to stay within 5 minutes)")
    ap.add_argument("--out", default=None,
                    help="where RESULTS.md and RESULTS.png go (default: benchmarks/ for a full run, "
                         "a new temporary directory with --quick)")
    ap.add_argument("--system-timeout", type=float, default=600.0, metavar="SECONDS",
                    help="time limit of each step of a system (set-up, each workload); past it the system "
                         "is reported as timed out and the run goes on; 0: none (default 600)")
    ap.add_argument("--s3-server", choices=RANGES, default="stored",
                    help="how moto serves a ranged GET: stored (only the range is read, as S3 does; default) "
                         "or moto (stock: the whole object for every ranged GET)")
    ap.add_argument("--settle", type=float, default=SETTLE_S, metavar="SECONDS",
                    help="seconds between dropping the page cache and each system's warmup, so that every "
                         "warmup starts with its free memory handed back to a VM's host (see benchmarks/peers.py; "
                         f"default {SETTLE_S:g})")
    ap.add_argument("--keep", action="store_true", help="keep the working directory (data, caches)")
    ap.add_argument("--quiet", action="store_true", help="print only the tables")
    args = ap.parse_args(argv)
    args.command = " ".join(["python -m benchmarks", *(sys.argv[1:] if argv is None else argv)])
    for name, (quick, full) in SIZES.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.workers < 1 or args.latency_ms < 0 or args.bandwidth_mbps < 0 or args.system_timeout < 0:
        ap.error("--workers must be >= 1, --latency-ms, --bandwidth-mbps and --system-timeout >= 0")
    args.systems = tuple(s.strip() for s in args.systems.split(",") if s.strip())
    args.sources = tuple(s.strip() for s in (args.sources or ("s3" if args.quick else ",".join(SOURCES))).split(",")
                         if s.strip())
    if not args.sources or any(s not in SOURCES for s in args.sources):
        ap.error(f"--sources: {','.join(args.sources) or 'none'} (known: {','.join(SOURCES)})")
    unknown = [s for s in args.systems if s not in SYSTEMS]
    if unknown or not args.systems or args.systems[0] != "local":
        ap.error(f"--systems: unknown {unknown} or the local copy is not first (known: {','.join(SYSTEMS)})"
                 if unknown else "--systems must start with 'local' (the limit and the reference checksums)")
    if args.out is None:
        args.out = tempfile.mkdtemp(prefix="datacache-bench-quick-") if args.quick else \
            os.path.dirname(os.path.abspath(__file__))
    return args


#: RESULTS.md's note on the S3 server, by ``--s3-server``
S3_NOTE = {
    "stored": "S3 server: moto with ranged GETs served from the stored object's range (`datacache.demo.moto_ranges`), "
              "as S3 and nginx (the HTTP rows) do; stock moto reads the whole object for every ranged GET, which "
              "penalised every ranged reader in earlier runs (`--s3-server moto` runs that).",
    "moto": "Caveat (S3 rows, `--s3-server moto`): stock moto reads a whole object for every ranged GET, so systems "
            "that fetch a large object in ranges (datacache's warmup, blockcache, rclone's chunked reads) make it "
            "read the shard many times over, while one whole-object GET (the local copy, simplecache, s3fs-fuse, "
            "JuiceFS's 4 MiB blocks) reads it once: on this source the warmup row understates ranged readers.",
}


@dataclass
class Report:
    """A finished run: the outcomes, the markdown text written, the files' paths, the dataset's
    ``sizes`` ({imagenet|shards|parquet: (files, bytes)}) and the removed working directory."""

    outcomes: list[Outcome]
    text: str
    results_md: str
    chart_png: str
    goals_met: int
    goals: int
    sizes: dict[str, tuple[int, int]]
    work: str


def _version(cmd: list[str], stderr: bool = False) -> str:
    """The first line a program's version command prints (on stderr where ``stderr``)."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
        out = r.stderr if stderr else r.stdout
    except OSError:
        return "not installed"
    return out.splitlines()[0].strip() if out else "unknown"


def machine() -> str:
    """CPU model, cores, memory and kernel of this machine (Linux ``/proc``)."""
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    mem = next((int(ln.split()[1]) // 1024 for ln in open("/proc/meminfo") if ln.startswith("MemTotal")), 0)
    return f"{cpu}, {os.cpu_count()} CPUs, {mem / 1024:,.1f} GiB RAM, Linux {platform.release()}"


def run(args: argparse.Namespace, log) -> Report:
    """Set everything up, run every system, write ``RESULTS.md`` / ``RESULTS.png`` into ``args.out``."""
    import fsspec

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    log(f"==> building the dataset ({args.files:,} JPEGs, a {args.shard_mib} MiB shard, {args.parquet_files} "
        f"Parquet files) on moto S3{' and nginx' if 'http' in args.sources else ''} behind the delay proxy")
    with DemoEnvironment(n_jpeg=args.files, shard_bytes=args.shard_mib << 20, keep=args.keep,
                         latency_ms=args.latency_ms, bandwidth_mbps=args.bandwidth_mbps,
                         n_parquet=args.parquet_files, parquet_rows=args.parquet_rows,
                         row_group_size=args.row_group_rows, http="http" in args.sources,
                         s3_ranges=args.s3_server) as env:
        log(f"    built in {env.build_seconds:.1f}s under {env.work}")
        mounts = Mounts()
        outcomes = []
        try:
            for source in args.sources:
                bench = PeerBench(env, make_systems(env, mounts, args.systems, source), mounts, args.workers,
                                  args.parquet_reads, log, args.repeat, args.system_timeout, args.settle)
                outcomes += bench.run()
        finally:
            for problem in mounts.cleanup():
                print(f"cleanup: {problem}", file=sys.stderr)
        sizes = {k: (len(env.files(f"s3/{k}/")), env.total_bytes(env.files(f"s3/{k}/")))
                 for k in ("imagenet", "shards", "parquet")}
        proxy = env.proxy.describe() if env.proxy is not None else "none"
        ranged = ("a ranged GET reads only its range of the stored object, as S3 does (--s3-server stored)"
                  if args.s3_server == "stored" else "stock moto: every ranged GET reads the whole object "
                  "(--s3-server moto)")
        source = f"moto S3 on loopback behind the delay proxy ({proxy}; {ranged})" if "s3" in args.sources else ""
        if "http" in args.sources:
            source += ("; " if source else "") + f"nginx ({_version(['nginx', '-v'], stderr=True).split(': ')[-1]}) on loopback " \
                      f"behind its own delay proxy ({proxy})"
        work = env.work
    elapsed = time.perf_counter() - t0
    load1 = os.getloadavg()

    headers, rows, met, goals = ratio_rows(outcomes)
    mem_headers, mem = memory_rows(outcomes)
    os.makedirs(args.out, exist_ok=True)
    png = chart(outcomes, os.path.join(args.out, "RESULTS.png"),
                f"datacache vs peers ({'quick' if args.quick else 'full'} run, {started})")
    data = "; ".join(f"{k}: {n:,} file{'s' if n != 1 else ''}, {b / 1e6:,.1f} MB" for k, (n, b) in sizes.items())
    text = "\n".join([
        f"# Benchmarks: datacache and its peers ({'quick' if args.quick else 'full'} run)",
        "",
        f"- date: {started}; total time {elapsed:,.0f} s",
        f"- machine: {machine()}; load average {load0[0]:.1f} at the start, {load1[0]:.1f} at the end "
        f"(other jobs share this machine when it is above ~1: the figures are then noisy)",
        f"- software: Python {platform.python_version()}, fsspec {fsspec.__version__}, "
        f"{_version(['rclone', 'version'])}, {_version(['s3fs', '--version'])}, "
        f"{_version([juicefs_binary() or 'juicefs', 'version'])}",
        f"- sources: {source}" + ("" if "http" in args.sources else
                                  " (the HTTP source runs in a full run, or with --sources s3,http)"),
        f"- data: {data}",
        f"- readers: {args.workers} worker processes, shuffled order (DataLoader-shaped, persistent workers); "
        f"{args.parquet_reads} random row-group reads; warm epoch, shard and Parquet: median of {args.repeat} passes; "
        f"warmup: median of {args.repeat} cold warmups for datacache (a fresh home each), one for the peers; the "
        f"local copy's: median of its {args.repeat} (a scratch copy each) and of one more after each of datacache's "
        "cold warmups (alternating, so the limit is sampled across the run); every byte checked against the "
        "source's checksums",
        "- time limit: " + (f"{args.system_timeout:g} s per step of a system (set-up, each workload); a system "
                            "past it is reported as timed out, not counted" if args.system_timeout else "none"),
        f"- command: `{args.command}`",
        "",
        "Ratios, per source: each system's rate / the local copy's from that source (the limit), and / the best "
        "peer's (rclone, s3fs-fuse, fsspec's caches, JuiceFS CE). Warmup: the local copy is what the delayed source "
        "delivers with parallel GETs (S3: one GET per object; HTTP: 8 MiB ranged GETs, 16 in flight), a second "
        "copy in a process of its own as `datacache warmup` is (a long-lived process reuses memory it touched "
        "before: 449-569 against 352-394 MB/s), timed after the epochs as every system's warmup is, each after "
        f"the page cache is dropped and {args.settle:g} s pass (this VM hands freed memory back to its host "
        "within seconds and then charges a fault per page written: the same copy ran 750, 414 and 280 MB/s 0, 6 "
        "and 12 s after a drop); peers read every file once; datacache runs `datacache warmup`, JuiceFS `juicefs "
        "warmup`. Shard and Parquet reads "
        "follow the warmup; the cold epoch starts from an empty cache (page cache dropped), the warm epoch is the "
        "next one. Goals: both datacache systems ahead of the best peer (>= 1x) in every row, and their warmups "
        ">= 0.9x the local copy (issue 20); the warm epoch through FUSE >= 0.7x local and >= 2x the best peer "
        "(issue 8). In the shard and Parquet rows every system but rclone and s3fs-fuse reads the same page "
        "cache with the same `read(2)` (through FUSE by passthrough), so those rows are ties within the noise.",
        "",
        S3_NOTE[args.s3_server],
        "",
        "JuiceFS CE differs from the others: its data lives in its own chunk format (4 MiB blocks) in a bucket of "
        "its own on the same S3 server, written once at set-up (not timed), and its metadata is a local SQLite "
        "file, so it lists and opens without the source; its memory is its supervisor's and mount process's, "
        "summed. S3 only.",
        "",
        "datacache FUSE mount: the JPEG tree through a `--read-mode no-open` mount, the shard and the Parquet "
        "files through a `--read-mode passthrough` mount of the same home, both with `-o io_uring` (FUSE over "
        "io_uring: the fuse module's `enable_uring` is turned on for their INIT, as root, and back after; where the "
        "kernel cannot, a mount serves through `/dev/fuse` and the run says so on stderr).",
        "",
        markdown_table(headers, rows),
        "",
        f"Goals met: {met}/{goals}.",
        "",
        "Peak memory (RSS, MiB) of each system's processes:",
        "",
        markdown_table(mem_headers, mem),
        "",
        f"![chart]({os.path.basename(png)})",
        "",
        *dlio_section(args.out),
    ])
    md = os.path.join(args.out, "RESULTS.md")
    with open(md, "w") as f:
        f.write(text)
    return Report(outcomes, text, md, png, met, goals, sizes, work)


def dlio_section(out: str) -> list[str]:
    """RESULTS.md's lines on the last ``python -m benchmarks.dlio --out OUT`` run (``DLIO.md`` and
    ``DLIO.png`` in ``out``), dated by the start time its table states (a file's mtime is the time
    of a clone, not of the run); [] when there is none."""
    path = os.path.join(out, "DLIO.md")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        table = f.read().strip()
    started = re.search(r"started (\d{4}-\d\d-\d\d \d\d:\d\d UTC)", table)
    when = f", started {started.group(1)}" if started else ""
    return ["## MLPerf Storage's DLIO through each system", "",
            f"From its own run (`python -m benchmarks.dlio --out {os.path.relpath(out)}`{when}), not "
            "this one; see `benchmarks/dlio.py` for the scaling. MLPerf's closed rules need a dataset of at least 5x "
            "the host's RAM and real accelerators; one 2-CPU machine gives neither, so the data fits in RAM and in "
            "every cache.", "", table, "", "![DLIO chart](DLIO.png)", ""]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log = (lambda s: None) if args.quiet else (lambda s: print(s, flush=True))
    report = run(args, log)
    print()
    print(report.text)
    print(f"written: {report.results_md}, {report.chart_png}")
    failed = [o for o in report.outcomes if o.status.startswith(("failed", "timed out"))]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
