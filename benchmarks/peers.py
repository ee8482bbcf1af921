"""The side-by-side run behind ``python -m benchmarks``: every system, every workload, one run.

``PeerBench(env, systems, mounts, workers, parquet_reads, log, repeat).run()`` measures, for each
system in turn (the local copy first: its bytes, checked by sha256 against the generator's, give
the reference checksums every other system is checked against), starting from an empty cache
(and the page cache dropped, when root):

- **cold epoch**: one epoch over the JPEG tree with the DataLoader-shaped reader
  (``benchmarks.loader``: ``workers`` processes, shuffled order), files/s and MB/s; for the local
  copy (made before, untimed) it is the copy read with the page cache dropped;
- **warm epoch**: the next epochs (``repeat``, each with another shuffle, the same worker
  processes); the median is kept;
- **warmup**: bring the large objects (the shard and the Parquet files) into the cache, MB/s (see
  ``benchmarks.systems``: parallel GETs for the local copy, a second copy into a scratch directory
  at this point in a process of its own, the warmup engine for datacache, one read of every file
  with the reader pool for the peers), after the epochs for every system, each after the page cache
  is dropped and ``settle`` seconds pass. The median of ``repeat`` cold warmups where the system can
  start one again from an empty cache without a new mount (the local copy: another scratch copy;
  datacache: a fresh home, made before the settle, as every set-up step of a warmup is; the last one
  fills the cache the later rows read), of one for the peers;
  single warmups of one system moved by up to 1.7x (datacache from HTTP 336-562 MB/s, four
  alternating with a fresh-process copy, 2026-12-05). The local copy's figure is the median of its
  own cold copies and of one more after each of datacache's cold warmups (``_paired_copy``), so that
  the limit is sampled across the run, alternating with datacache as A/B runs are: its own block is
  one moment of the run (from HTTP its copies made 497 MB/s in a full run of 2026-12-05 15:07 UTC,
  the same copy alternating with datacache's warmups 460-626, median 564, at 17:35). Why the settle:
  a VM with free page reporting (virtio-balloon, as here) hands freed memory back to its host about
  2 s after it is freed, and a later write to it costs a fault per page (~3 ms a MB); a warmup
  started right after the previous steps freed memory wrote into pages not yet handed back. Measured
  (one run, the HTTP source's local copy after a drop): 750 MB/s at once, 414 after 6 s, 280 after
  12 s; datacache's warmup, which starts in a process of its own a second later, ran 297-444 MB/s
  either way. The JPEG tree's first copy is the cold epoch;
- **shard**: sequential read of the WebDataset shard(s), one stream, 1 MiB reads, MB/s (the
  median of ``repeat`` passes: the first is served by the system's cache, later ones may be by
  the kernel's page cache, as a second epoch would be);
- **parquet**: ``parquet_reads`` random row groups (uniform over files x row groups, with
  replacement, the same list for every system) read with pyarrow, row groups/s; the median of
  ``repeat`` passes (each in another order): one pass of 100 row groups takes ~0.6 s, and single
  passes of one system through the same mount spread 123-198 a second (2026-12-05).

Every read is checked (xxh3-64 of whole files, row-group sums); a system whose reads fail, or
that raises, is marked ``failed: <first error>`` and the run goes on with the next.

Time limit (``time_limit`` seconds, 0: none): a system's steps - its set-up (mount, reader
processes), each workload, its clean-up - run in a thread of its own, and the main thread gives
each step ``time_limit`` seconds. A step still running then makes the system ``timed out after N
s in <step>``:
its reader processes are killed, its warmup process group too, and every mount of the run that
is still up is unmounted and its daemon ended (``System.abort``); the run goes on with the next
system. Its figures are not counted, and a goal of its is NOT met. The local copy is the limit
and the reference checksums: when it times out the run stops (RuntimeError). Peak memory:
the serving process's ``VmHWM`` (FUSE daemons), the warmup process's (``datacache warmup``), and
the largest reader process's (where ``datacache://`` and fsspec's caches live).
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from benchmarks.common import DemoEnvironment
from benchmarks.fuse_read import DROP_CACHES, Mounts, drop_caches
from benchmarks.loader import ReaderPool, Result, Task, file_checksum, rowgroup_checksum
from benchmarks.systems import System

__all__ = ["GOALS", "WORKLOADS", "Goal", "Outcome", "PeerBench", "TimedOut", "Workload"]


@dataclass(frozen=True)
class Workload:
    """``key``, a ``title`` for tables, the ``unit`` its ratios compare (files/s, MB/s, row groups/s)."""

    key: str
    title: str
    unit: str


WORKLOADS = (
    Workload("warmup", "warmup / first copy (shard + Parquet)", "MB/s"),
    Workload("cold", "JPEG tree, cold epoch", "files/s"),
    Workload("warm", "JPEG tree, warm epoch", "files/s"),
    Workload("shard", "shard, sequential read", "MB/s"),
    Workload("parquet", "Parquet, random row groups", "row groups/s"),
)


@dataclass(frozen=True)
class Goal:
    """A goal of the issues: each of ``systems`` >= ``vs_local`` x the local copy (0: none) and
    >= ``vs_peer`` x the best peer in ``workload``."""

    workload: str
    systems: tuple[str, ...]
    vs_local: float
    vs_peer: float


DATACACHE_SYSTEMS = ("datacache FUSE mount", "datacache:// (fsspec)")
GOALS = (  # the first goal of a (workload, system) counts
    Goal("warm", ("datacache FUSE mount",), 0.7, 2.0),  # issue 8 (the native-reads issue)
    Goal("warmup", DATACACHE_SYSTEMS, 0.9, 1.0),  # issue 20: the delayed source's parallel GETs, JuiceFS's warmup
    # issue 20: "every row: datacache ahead of JuiceFS CE and of the best other peer, cold and warm"
    *(Goal(w, DATACACHE_SYSTEMS, 0.0, 1.0) for w in ("cold", "warm", "shard", "parquet")),
)


@dataclass
class Measure:
    """One timed pass: wall ``seconds``, ``nbytes``, ``items`` (files or row groups); the median
    of ``passes`` passes."""

    seconds: float
    nbytes: int
    items: int
    passes: int = 1

    def rate(self, unit: str) -> float:
        """Per second in ``unit``: MB/s (10^6 bytes), files/s or row groups/s."""
        return (self.nbytes / 1e6 if unit == "MB/s" else self.items) / self.seconds


@dataclass
class Outcome:
    """What one system did: ``status`` ok | not installed (...) | failed: ..., its measures by
    workload key, and peak RSS in MiB (None where there is no such process); ``source`` it read
    (s3 | http: ratios compare systems of one source)."""

    system: str
    role: str
    source: str = "s3"
    status: str = "ok"  # or "timed out after N s in <step>" (see the module doc)
    measures: dict[str, Measure] = field(default_factory=dict)
    daemon_rss_mib: float | None = None
    warmup_rss_mib: float | None = None
    reader_rss_mib: float | None = None
    seconds: float = 0.0


class TimedOut(Exception):
    """A step of a system ran past the time limit; the message is the status ("timed out after ...")."""


class _Aborted(Exception):
    """Raised in a system's thread at its next step once the main thread gave up on it."""


SETTLE_S = 15.0  # seconds from the page cache drop to a warmup: freed memory handed back first (module doc)
ABORT_GRACE = 60.0  # seconds the main thread waits for a timed-out system's thread to unwind


class PeerBench:
    """See the module doc. ``env``: a started ``DemoEnvironment``; ``systems``: from
    ``benchmarks.systems.make_systems`` (the local copy first); ``mounts``: where the systems'
    mounts are recorded, cleaned up by the caller; ``time_limit``: seconds per step (0: none)."""

    def __init__(self, env: DemoEnvironment, systems: list[System], mounts: Mounts, workers: int,
                 parquet_reads: int, log: Callable[[str], None], repeat: int = 3, time_limit: float = 0.0,
                 settle: float = 0.0):
        if not systems or systems[0].role != "local":
            raise ValueError("the local copy must be the first system (it gives the reference checksums)")
        if time_limit < 0:
            raise ValueError("time_limit must be >= 0 seconds (0: none)")
        self.env, self.systems, self.mounts = env, systems, mounts
        self.workers, self.parquet_reads, self.log, self.repeat = workers, parquet_reads, log, repeat
        self.time_limit, self.settle = time_limit, settle
        self.outcomes: list[Outcome] = []
        self.checksums: dict[str, int] = {}
        self.rowgroups: list[Task] = []
        self.can_drop = os.access(DROP_CACHES, os.W_OK)
        # the running step, its deadline (time.monotonic) and the reader pool, read by the main thread;
        # the thread that runs the steps now (None once the main thread gave up on it)
        self._step_title, self._deadline = "", 0.0
        self._pool: ReaderPool | None = None
        self._runner: threading.Thread | None = threading.current_thread()
        # per source: the local copy, its outcome and its warmup passes (``_paired_copy`` adds to them)
        self._limits: dict[str, tuple[System, Outcome, list[Result]]] = {}

    # -- reference -------------------------------------------------------------------------------
    def paths(self, prefix: str) -> list[str]:
        return self.env.files(prefix)

    def make_reference(self, root: str) -> None:
        """Check the local copy against the generator's sha256, then take every file's xxh3 and every
        row group's sums from it; choose the random row groups."""
        import pyarrow.parquet as pq

        all_rowgroups = []
        for p in self.paths("s3/"):
            with open(os.path.join(root, p[len("s3/"):]), "rb") as f:
                data = f.read()
            if hashlib.sha256(data).hexdigest() != self.env.sums[p]:
                raise AssertionError(f"local copy of {p}: sha256 differs from the generator's")
            self.checksums[p] = file_checksum(data)
            if p.endswith(".parquet"):
                with open(os.path.join(root, p[len("s3/"):]), "rb") as f:
                    pf = pq.ParquetFile(f)
                    for i in range(pf.num_row_groups):
                        rg = pf.metadata.row_group(i)
                        size = sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))
                        all_rowgroups.append(Task("rowgroup", p, rowgroup_checksum(pf.read_row_group(i)), i, size))
        rng = random.Random(7)
        self.rowgroups = [rng.choice(all_rowgroups) for _ in range(self.parquet_reads)]

    def tasks(self, prefix: str, kind: str) -> list[Task]:
        return [Task(kind, p, self.checksums.get(p)) for p in self.paths(prefix)]

    # -- the run ---------------------------------------------------------------------------------
    def run(self) -> list[Outcome]:
        for system in self.systems:
            out = Outcome(system.name, system.role, source=system.source)
            self.outcomes.append(out)
            if system.missing:
                out.status = system.missing
                self.log(f"==> {system.name}: {system.missing}")
                continue
            t0 = time.perf_counter()
            try:
                self._run_limited(system, out)
            except TimedOut as err:
                out.status = str(err)
                if system.role == "local":
                    raise RuntimeError(f"the local copy {err}: without the limit and the reference checksums "
                                       "the run cannot go on (raise --system-timeout)") from None
            except Exception as err:  # noqa: BLE001 - one system's failure is a row, not the end of the run
                out.status = f"failed: {type(err).__name__}: {err}"[:400]
                if system.role == "local":
                    raise
            finally:
                system.end()
                out.daemon_rss_mib, out.warmup_rss_mib = system.daemon_rss_mib, system.warmup_rss_mib
                out.seconds = time.perf_counter() - t0
                self._remove_cache(system)
            self.log(f"    {system.name}: {out.status}, {out.seconds:.1f}s")
        return self.outcomes

    def _step(self, title: str) -> None:
        """Start the next step of the running system: a fresh deadline; raises _Aborted in a
        thread the main thread gave up on (it must not touch the next system's clock)."""
        if threading.current_thread() is not self._runner:
            raise _Aborted(title)
        self._step_title, self._deadline = title, time.monotonic() + self.time_limit

    def _run_limited(self, system: System, out: Outcome) -> None:
        """``run_system`` under the time limit (see the module doc); raises TimedOut, or what
        ``run_system`` raised."""
        if not self.time_limit:
            self._runner = threading.current_thread()
            self.run_system(system, out)
            return
        errors: list[BaseException] = []

        def target() -> None:
            try:
                self.run_system(system, out)
            except BaseException as err:  # noqa: BLE001 - handed to the main thread
                errors.append(err)

        self._pool = None
        thread = threading.Thread(target=target, name=f"benchmark {system.name}", daemon=True)
        self._runner = thread
        self._step_title, self._deadline = "set-up", time.monotonic() + self.time_limit
        thread.start()
        while thread.is_alive() and (left := self._deadline - time.monotonic()) > 0:
            thread.join(left)  # the deadline moves on at each step: look again
        if thread.is_alive():
            status = f"timed out after {self.time_limit:g} s in {self._step_title}"
            self.log(f"    {system.name}: {status}: stopping its processes and mounts")
            self._abort(system, thread)
            raise TimedOut(status)
        self._runner = threading.current_thread()
        if errors:
            raise errors[0]

    def _abort(self, system: System, thread: threading.Thread) -> None:
        """Stop a timed-out system's readers, warmup process and mounts, again until its thread
        has unwound (it may still create a pool or a mount) or ``ABORT_GRACE`` has passed."""
        self._runner = None
        end = time.monotonic() + ABORT_GRACE
        while True:
            if self._pool is not None:
                self._pool.kill()
            limit = self._limits.get(system.source, (system,))[0]  # a paired copy may be running
            for stopping in {id(s): s for s in (system, limit)}.values():
                for problem in stopping.abort():
                    self.log(f"    cleanup: {problem}")
            thread.join(0.5)
            if not thread.is_alive():
                return
            if time.monotonic() > end:
                self.log(f"    {system.name}: still busy in this process after {ABORT_GRACE:g} s; going on")
                return

    def _remove_cache(self, system: System) -> None:
        """Remove this system's cache and copy directories (not its mount point, maybe still busy)."""
        if system.role == "local":
            return
        for d in os.listdir(self.env.work):
            if d.startswith(system.slug + "-") and not d.endswith("-mnt"):
                shutil.rmtree(os.path.join(self.env.work, d), ignore_errors=True)

    def _record(self, out: Outcome, key: str, *passes: Result) -> None:
        """Keep the median pass (by time; the lower middle of an even count); any error fails."""
        for r in passes:
            if r.errors:
                raise AssertionError(f"{WORKLOAD_TITLES[key]}: {len(r.errors)} failed read(s), e.g. {r.errors[0]}")
            if r.peak_rss_mib:
                out.reader_rss_mib = max(out.reader_rss_mib or 0.0, r.peak_rss_mib)
        ordered = sorted(passes, key=lambda p: p.seconds)
        r = ordered[(len(passes) - 1) // 2]
        out.measures[key] = Measure(r.seconds, r.nbytes, r.items, len(passes))
        unit = WORKLOAD_UNITS[key]
        rates = [Measure(p.seconds, p.nbytes, p.items).rate(unit) for p in (ordered[-1], ordered[0])]
        spread = f"; {len(passes)} passes, {rates[0]:,.1f}-{rates[1]:,.1f}" if len(passes) > 1 else ""
        self.log(f"    {out.system}: {WORKLOAD_TITLES[key]}: {out.measures[key].rate(unit):,.1f} {unit} "
                 f"({r.nbytes / 1e6:,.1f} MB in {r.seconds:.2f}s{spread})")

    def _paired_copy(self, source: str, stream: list[Task]) -> None:
        """Right after a cold warmup of datacache: one more cold copy by the local copy of ``source``
        (after the settle, as every warmup), added to its warmup passes; its figure becomes their
        median (see the module doc)."""
        if source not in self._limits:  # no local copy of this source ran (a test's selection)
            return
        limit, out, passes = self._limits[source]
        self._step(WORKLOAD_TITLES["warmup"])
        passes.append(limit.cold_warmup(stream, self._settle_for_warmup))
        self._record(out, "warmup", *passes)

    def _settle(self) -> None:
        """Before a warmup: drop the page cache (when root) and wait ``settle`` seconds, so every
        system's warmup starts from the same memory state (see the module doc)."""
        self._step("settle")
        if self.can_drop:
            drop_caches()
        time.sleep(self.settle)

    def _settle_for_warmup(self) -> None:
        """``_settle``, then the warmup's own step (a fresh deadline): a cold warmup's ``settle``."""
        self._settle()
        self._step(WORKLOAD_TITLES["warmup"])

    def run_system(self, system: System, out: Outcome) -> None:
        """Every workload of ``system`` into ``out``; each step starts with ``_step`` (the limit)."""
        self.log(f"==> {system.name} ({system.source})")
        self._step("set-up")
        opener = system.begin()
        large = [p for p in self.paths("s3/") if not p.startswith("s3/imagenet/")]
        if system.role == "local":
            system.fill([Task("stream", p, None) for p in self.paths("s3/")])
            self.make_reference(opener.prefix)
        jpegs = self.tasks("s3/imagenet/", "whole")
        self._step("set-up")
        self._pool = ReaderPool(opener, self.workers)  # started here, so that _abort can kill it while it sets up
        with self._pool as pool:
            if self.can_drop:
                drop_caches()
            self._step(WORKLOAD_TITLES["cold"])
            self._record(out, "cold", pool.run(jpegs, seed=1))
            self._step(WORKLOAD_TITLES["warm"])
            self._record(out, "warm", *(pool.run(jpegs, seed=2 + k) for k in range(self.repeat)))
            stream = [Task("stream", p, self.checksums[p]) for p in large]
            warmups = []
            for _ in range(self.repeat - 1 if system.cold_warmups else 0):  # first: the last fills the cache
                self._step(WORKLOAD_TITLES["warmup"])
                warmups.append(system.cold_warmup(stream, self._settle_for_warmup))
                if system.role == "datacache":
                    self._paired_copy(system.source, stream)
            self._settle()
            self._step(WORKLOAD_TITLES["warmup"])
            warmups.append(system.warmup(pool, stream))
            if system.role == "local":
                self._limits[system.source] = (system, out, warmups)
            self._record(out, "warmup", *warmups)
            self._step(WORKLOAD_TITLES["shard"])
            self._record(out, "shard", *(pool.run(self.tasks("s3/shards/", "stream")) for _ in range(self.repeat)))
            self._step(WORKLOAD_TITLES["parquet"])
            self._record(out, "parquet", *(pool.run(self.rowgroups, seed=3 + k) for k in range(self.repeat)))
        self._step("clean-up")
        system.end()


WORKLOAD_TITLES = {w.key: w.title for w in WORKLOADS}
WORKLOAD_UNITS = {w.key: w.unit for w in WORKLOADS}
