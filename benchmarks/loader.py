"""A PyTorch-DataLoader-shaped reader: persistent worker processes, shuffled order, every byte checked.

``ReaderPool(opener, workers)`` spawns ``workers`` processes (the ``spawn`` start method: the
parent runs threads and event loops that ``fork`` would copy half-way). Each builds its client
once (``Opener.setup``: an fsspec filesystem, or nothing for a path) and then serves jobs, as a
``DataLoader(num_workers=N, persistent_workers=True)`` does: an epoch's shuffled index list is
dealt round-robin to the workers (the sampler's order, one sample per "batch"), each worker reads
its share and reports ``(bytes, items, errors)``. The clock runs from handing the job out to the
last report, so process start-up and client set-up are outside it.

Tasks (``Task``) are ``whole`` (read a file in one ``read()``: a JPEG for a decoder), ``stream``
(read a file in ``chunk``-byte ``read()`` calls until EOF: a WebDataset shard) and ``rowgroup``
(``pyarrow.parquet.ParquetFile(f).read_row_group(i)``: random access into Parquet). Every task
carries its expected checksum: xxh3-64 of the file's bytes for ``whole``/``stream`` (xxh3 runs
at memory speed, so checking costs every system alike and little), and
``(num_rows, sum(id), sum(label))`` for a row group. A mismatch or an exception is an error
string in the report, never a silent pass.

``Opener`` names the bytes the same way on every system: a dataset path such as
``s3/imagenet/train/x.JPEG`` becomes ``prefix + path[len(strip):]`` on a local directory or a
mount (``kind="path"``), or an fsspec name on ``fsspec.filesystem(protocol, **options)``
(``kind="fsspec"``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Opener", "ReaderPool", "Result", "Task", "deal", "file_checksum", "rowgroup_checksum"]

CHUNK = 1 << 20  # bytes per read() of a streamed file (the same on every system)


@dataclass(frozen=True)
class Task:
    """One read: ``kind`` whole | stream | rowgroup, dataset ``path``, row group ``index``,
    ``expected`` checksum (see module doc) and ``nbytes`` counted for a row group (its
    compressed size in the file: what a reader fetches)."""

    kind: str
    path: str
    expected: Any
    index: int = 0
    nbytes: int = 0


@dataclass(frozen=True)
class Opener:
    """How one system names and opens a dataset path (see module doc). Picklable."""

    kind: str  # "path" | "fsspec"
    prefix: str  # a directory (path) or a name prefix (fsspec)
    strip: str = ""  # taken off the dataset path first
    protocol: str = ""
    options: dict = field(default_factory=dict)
    probe: str = ""  # a dataset path looked up at set-up, so that opening the client is not timed
    # (dataset path prefix, prefix): paths under the first are named under the second instead
    routes: tuple[tuple[str, str], ...] = ()

    def name(self, path: str) -> str:
        if not path.startswith(self.strip):
            raise ValueError(f"{path!r} does not start with {self.strip!r}")
        rest = path[len(self.strip):]
        prefix = next((to for start, to in self.routes if path.startswith(start)), self.prefix)
        return os.path.join(prefix, rest) if self.kind == "path" else prefix + rest

    def setup(self) -> Any:
        """The client: None for paths, an fsspec filesystem (not shared with fsspec's instance cache)."""
        if self.kind == "path":
            if self.probe:
                os.stat(self.name(self.probe))
            return None
        import fsspec

        fs = fsspec.filesystem(self.protocol, skip_instance_cache=True, **self.options)
        if self.probe:
            fs.info(self.name(self.probe))
        return fs

    def open(self, client: Any, path: str):
        name = self.name(path)
        return open(name, "rb") if client is None else client.open(name, "rb")


def file_checksum(data: bytes) -> int:
    """xxh3-64 of ``data`` (the reference every system's bytes are checked against)."""
    import xxhash

    return xxhash.xxh3_64_intdigest(data)


def rowgroup_checksum(table) -> tuple[int, int, int]:
    """``(num_rows, sum(id), sum(label))`` of a row group of the demo's Parquet files."""
    import pyarrow.compute as pc

    return (table.num_rows, int(pc.sum(table.column("id")).as_py()), int(pc.sum(table.column("label")).as_py()))


def _run_task(opener: Opener, client: Any, task: Task) -> int:
    """Read ``task``; returns bytes read; raises AssertionError on a checksum mismatch."""
    if task.kind == "rowgroup":
        import pyarrow.parquet as pq

        with opener.open(client, task.path) as f:
            got = rowgroup_checksum(pq.ParquetFile(f).read_row_group(task.index))
        if got != tuple(task.expected):
            raise AssertionError(f"{task.path} row group {task.index}: {got} != {tuple(task.expected)}")
        return task.nbytes
    import xxhash

    with opener.open(client, task.path) as f:
        if task.kind == "whole":
            data = f.read()
            n, digest = len(data), xxhash.xxh3_64_intdigest(data)
        else:
            h, n = xxhash.xxh3_64(), 0
            while block := f.read(CHUNK):
                h.update(block)
                n += len(block)
            digest = h.intdigest()
    if digest != task.expected:
        raise AssertionError(f"{task.path}: checksum mismatch ({n} bytes read)")
    return n


def _setup(opener: Opener, conn) -> Any:
    """Set the client up and say so: ("ready", None), or ("error", message) and None."""
    try:
        client = opener.setup()
    except Exception as err:  # noqa: BLE001 - reported to the parent, which names the system
        conn.send(("error", f"{type(err).__name__}: {err}"))
        return None
    conn.send(("ready", None))
    return client


def _close(client: Any) -> None:
    close = getattr(client, "close", None)
    if callable(close):
        close()


def _vm_hwm_mib() -> float:
    """This process's peak RSS (``VmHWM``), MiB. Not ``ru_maxrss``: that keeps the parent's peak
    across the ``fork``/``exec`` of a spawned process."""
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) / 1024 for ln in f if ln.startswith("VmHWM:"))


def _worker(opener: Opener, conn) -> None:
    """A worker's loop: set up, then serve jobs (lists of tasks) until None."""
    import pyarrow.parquet  # noqa: F401 - imported before any job, so that no job's clock counts it
    import xxhash  # noqa: F401

    client = _setup(opener, conn)
    while (job := conn.recv()) is not None:
        nbytes, items, errors = 0, 0, []
        for task in job:
            try:
                nbytes += _run_task(opener, client, task)
                items += 1
            except Exception as err:  # noqa: BLE001 - every failure is reported, with its file
                errors.append(f"{task.path}: {type(err).__name__}: {err}"[:300])
        conn.send(("done", (nbytes, items, errors, _vm_hwm_mib())))
    _close(client)


@dataclass
class Result:
    """One job: wall ``seconds``, ``nbytes`` read, ``items`` (files or row groups) read and checked,
    ``errors`` (one line each), ``peak_rss_mib``: the largest worker's peak RSS so far (MiB)."""

    seconds: float
    nbytes: int
    items: int
    errors: list[str]
    peak_rss_mib: float


def deal(tasks: list[Task], workers: int, seed: int) -> list[list[Task]]:
    """Shuffle ``tasks`` (``random.Random(seed)``) and deal them round-robin to ``workers``."""
    order = list(tasks)
    random.Random(seed).shuffle(order)
    return [order[k::workers] for k in range(workers)]


class ReaderPool:
    """``workers`` persistent reader processes for ``opener`` (see module doc); a context manager.

    Constructing it starts the processes; entering it waits until every one has set up its client
    (so that ``kill`` can reach them while they do). Entering raises RuntimeError when a worker
    cannot set up its client or start within ``start_timeout`` seconds, or dies (``kill``)."""

    def __init__(self, opener: Opener, workers: int, start_timeout: float = 120.0):
        if workers < 1:
            raise ValueError("workers must be >= 1")
        ctx = mp.get_context("spawn")
        self.start_timeout = start_timeout
        self._procs, self._conns = [], []
        try:
            for _ in range(workers):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_worker, args=(opener, child), daemon=True)
                proc.start()
                child.close()
                self._procs.append(proc)
                self._conns.append(parent)
        except BaseException:
            self.close()
            raise

    def _await_ready(self) -> None:
        for conn in self._conns:
            if not conn.poll(self.start_timeout):
                raise RuntimeError(f"a reader process did not start within {self.start_timeout:.0f} s")
            try:
                kind, detail = conn.recv()
            except (EOFError, OSError):
                raise RuntimeError("a reader process exited while it started") from None
            if kind != "ready":
                raise RuntimeError(f"a reader process could not open the system: {detail}")

    def __enter__(self) -> ReaderPool:
        try:
            self._await_ready()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, tasks: list[Task], seed: int = 0, timeout: float = 1800.0) -> Result:
        """One epoch over ``tasks`` in shuffled order (``deal``); waits at most ``timeout`` seconds."""
        shares = deal(tasks, len(self._conns), seed)
        t0 = time.perf_counter()
        for conn, share in zip(self._conns, shares, strict=True):
            conn.send(share)
        nbytes = items = 0
        errors: list[str] = []
        rss = 0
        for conn in self._conns:
            if not conn.poll(max(0.0, timeout - (time.perf_counter() - t0))):
                raise RuntimeError(f"a reader process did not finish within {timeout:.0f} s")
            try:
                _, (b, n, errs, hwm_mib) = conn.recv()
            except (EOFError, OSError):
                raise RuntimeError("a reader process exited in the middle of a job") from None
            nbytes, items, rss = nbytes + b, items + n, max(rss, hwm_mib)
            errors += errs
        return Result(time.perf_counter() - t0, nbytes, items, errors, rss)

    def kill(self) -> None:
        """SIGKILL every worker now, wherever it is (a read that never ends, a client that does not
        start): a ``run`` or ``__enter__`` waiting on them raises RuntimeError; ``close`` reaps them.
        Safe from another thread."""
        for proc in list(self._procs):
            if proc.exitcode is None:
                proc.kill()

    def close(self) -> None:
        """Stop the workers (a None job, then terminate what is left) and reap them. Idempotent."""
        for conn in self._conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for proc in self._procs:
            proc.join(10)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []
