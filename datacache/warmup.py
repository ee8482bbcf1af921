"""Warmup (DataLoad) engine: prefetch a dataset's files into the cache before training.

Targets are dataset paths: a file, a directory (everything below) or a glob. Each file is cut into
segments of up to ``segment_bytes`` (smaller when the whole load is only a few segments per thread,
so one large object is still read by parallel GETs, and when ``parallel`` segments would not fit
in the source's memory budget); a segment is one UFS read that fills several
blocks, so a large object costs a few large GETs and a small file one. Segments run ``parallel``
at a time (the UFS sees that many concurrent reads) and hold their bytes against the source's
memory budget.
A load larger than half the machine's RAM (``BULK_RAM_FRACTION``) is written around the page cache
(``O_DIRECT``): the page cache could not keep it, so filling it would only evict what readers use
and cost the CPU of touching every page; a smaller one goes through it, so the first epoch after
it reads memory.
Already-cached blocks are skipped (a block file gone or short is not cached: it is loaded again),
so a warmup is resumable. At the end every target is checked
against what the cache actually holds (case C13): Complete means 100 % of its current-version
bytes are cached; anything else is Failed with what is missing and why (cases C1, C9), or
Cancelled when the caller stopped the load.

A cancel takes effect within ``CANCEL_GRACE_S``: queued segments are dropped, and segments still
reading from the UFS after the grace are abandoned (a 32 MiB GET from a slow store can take
minutes). The segment threads are daemon threads, so an exiting process does not wait for them;
a block is stored whole or not at all, and a write cut short by the exit is swept as an orphan
(see ``cache.disk``).
"""

from __future__ import annotations

import errno
import os
import threading
import time
from dataclasses import dataclass, field
from queue import Empty, Full, Queue
from typing import Callable

from datacache.cache.blocks import block_count
from datacache.cache.disk import DEVICE_FULL
from datacache.cache.local_source import FILL_COPIES, full_bypasses
from datacache.errors import DatacacheError, StaleFileError
from datacache.manifest import FileEntry

_MAX_LISTED = 10
CANCEL_GRACE_S = 0.5
"""Seconds that segments in flight get to finish after a cancel before they are abandoned."""
BULK_RAM_FRACTION = 0.5
"""A load of more than this fraction of the machine's RAM (bytes selected) is written around the
page cache (see the module doc)."""


@dataclass
class TargetResult:
    """One target's outcome: ``files``/``bytes`` selected, ``cached_bytes`` held after the run,
    ``failures`` (messages), ``phase`` Complete | Failed | Cancelled (not complete, no file of it
    failed, and the load was cancelled), ``cached_files``: its files 100 % cached after the run."""

    path: str
    files: int = 0
    bytes: int = 0
    cached_bytes: int = 0
    failures: list[str] = field(default_factory=list)
    phase: str = "Pending"
    cached_files: int = 0  # files 100 % cached after the run


@dataclass
class WarmupResult:
    """A run's outcome: per target, its ``duration`` (seconds), ``loaded_bytes`` read from the UFS;
    ``cancelled``: the caller stopped it; ``in_flight``: segment threads abandoned after a cancel,
    still reading (close the client only after them, see :func:`close_after`)."""

    targets: list[TargetResult]
    duration: float
    loaded_bytes: int
    cancelled: bool = False
    in_flight: tuple[threading.Thread, ...] = ()

    @property
    def ok(self) -> bool:
        return all(t.phase == "Complete" for t in self.targets)

    @property
    def phase(self) -> str:
        """Complete | Cancelled | Failed (Complete wins over a cancel that came too late to matter)."""
        return "Complete" if self.ok else "Cancelled" if self.cancelled else "Failed"

    def total(self, name: str) -> int:
        """The sum over the targets of a TargetResult field: ``files``, ``bytes``, ``cached_bytes``
        or ``cached_files`` (a file under several targets counts once per target)."""
        return sum(getattr(t, name) for t in self.targets)


@dataclass
class TargetProgress:
    """Live counters of one target: files and bytes (of its selected files) done out of its totals."""

    path: str
    files_total: int = 0
    bytes_total: int = 0
    files_done: int = 0
    bytes_done: int = 0


@dataclass
class Progress:
    """Live counters for a progress bar: files and bytes done out of the totals, overall (a file
    under several targets counts once) and per target (``targets``, in the order given);
    ``bytes_loaded``: bytes read from the UFS so far, the numerator of the load rate."""

    files_total: int = 0
    bytes_total: int = 0
    files_done: int = 0
    bytes_done: int = 0
    targets: list[TargetProgress] = field(default_factory=list)
    bytes_loaded: int = 0  # read from the UFS so far (blocks already cached are skipped: not counted)


def warmup(client, targets: list[str | tuple[str, list[str]]] | None = None, *, parallel: int = 16, segment_bytes: int = 32 << 20,
           on_progress: Callable[[Progress], None] | None = None,
           cancel: threading.Event | None = None, check: bool = False,
           bulk_over: int | None = None) -> WarmupResult:
    """Load ``targets`` (default: the whole dataset) of ``client`` (a DatasetClient) into its cache.
    A target is a dataset path (file, directory, glob) or ``(label, [file path, ...])``, a list
    loaded in its order (a recorded trace).

    Blocks already held are skipped when their files are there at their size; with ``check``
    only when their bytes also pass their checksum (every cached block is read, as ``juicefs
    warmup --check``). Missing or damaged blocks are loaded again.

    A file changed in the UFS since the last metadata sync (ESTALE) has its entry re-read, as a
    reader's does, and its current version is loaded. Never raises for a bad target or a failed
    file: they are reported in the result. ``cancel``
    (set from another thread or a signal handler) stops the load within ``CANCEL_GRACE_S``
    seconds: no new segment starts, segments in flight get the grace to finish and are then
    abandoned (``WarmupResult.in_flight``). Each block is stored whole or not at all, so what is
    loaded stays loaded and a later run resumes from it. ``bulk_over`` (bytes; default
    ``BULK_RAM_FRACTION`` of the RAM): a load of more bytes is written around the page cache.
    """
    started = time.monotonic()
    manifest = client.manifest
    results: list[TargetResult] = []
    selected: dict[str, FileEntry] = {}
    per_target: list[list[FileEntry]] = []
    for path in targets or [""]:
        res = TargetResult((path[0] if isinstance(path, tuple) else path) or "/")
        results.append(res)
        per_target.append([])
        try:
            entries = _listed(manifest, path) if isinstance(path, tuple) else manifest.select(path)
        except ValueError as err:
            res.failures.append(str(err))
            continue
        if not entries and isinstance(path, str) and not manifest.is_dir(path):  # an empty directory: Complete
            res.failures.append(
                f"{path}: no such file, directory or match in dataset {client.name!r} as of its last metadata "
                f"sync; a file added to the UFS since is listed after `datacache sync {client.name}` (or the "
                "Dataset's spec.autoSyncInterval)")
            continue
        res.files, res.bytes = len(entries), sum(e.size for e in entries)
        per_target[-1] = entries
        selected.update((e.path, e) for e in entries)

    progress = Progress(len(selected), sum(e.size for e in selected.values()),
                        targets=[TargetProgress(r.path, r.files, r.bytes) for r in results])
    owners: dict[str, list[TargetProgress]] = {}  # dataset path -> the targets that selected it
    for counters, mine in zip(progress.targets, per_target):
        for e in mine:
            owners.setdefault(e.path, []).append(counters)
    if on_progress is not None:  # the totals are known: a bar can start here
        on_progress(progress)
    ufs_before, full_before = client.source.ufs_bytes, _device_full_count(client.source)
    if bulk_over is None:
        bulk_over = int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") * BULK_RAM_FRACTION)
    bulk = progress.bytes_total > bulk_over
    file_errors, stale, in_flight = _load(client, list(selected.values()), owners, parallel, segment_bytes,
                                          progress, on_progress, cancel, check, bulk)
    cancelled = cancel is not None and cancel.is_set()
    if stale and not cancelled:  # changed in the UFS since the sync: load their current versions
        fresh = _refresh(client, stale, file_errors)
        per_target = [[fresh.get(e.path, e) for e in mine] for mine in per_target]
        more_errors, _, in_flight = _load(client, list(fresh.values()), {p: [] for p in fresh}, parallel,
                                          segment_bytes, Progress(len(fresh), 0), None, cancel, check, bulk)
        file_errors.update(more_errors)
        cancelled = cancel is not None and cancel.is_set()
        for res, mine in zip(results, per_target):
            res.bytes = sum(e.size for e in mine)
    loaded = client.source.ufs_bytes - ufs_before
    # loaded, then evicted: to make room in a device that filled before the quota, or by the quota
    evicted = _EVICTED_FULL if _device_full_count(client.source) > full_before else _EVICTED

    held_bytes: dict[str, int] = {}  # dataset path -> its bytes cached (a file may be under several targets)
    for res, mine in zip(results, per_target):
        if res.failures:
            res.phase = "Failed"
            continue
        # One presence check per block (a stat of its file), serial after the run: once per file,
        # not once for the bytes and again for the fraction (2000 small files: 0.9 s -> 0.45 s).
        for e in mine:
            if e.path not in held_bytes:
                held_bytes[e.path] = client.cached_file_bytes(e)
        res.cached_bytes = sum(held_bytes[e.path] for e in mine)
        missing = [e for e in mine if held_bytes[e.path] < e.size]
        res.cached_files = res.files - len(missing)
        # A cancelled load names only files that failed: the rest were simply not reached.
        named = [e for e in missing if e.path in file_errors] if cancelled else missing
        for e in named[:_MAX_LISTED]:
            res.failures.append(f"{e.path}: {file_errors.get(e.path, evicted)}")
        if len(named) > _MAX_LISTED:
            res.failures.append(f"... and {len(named) - _MAX_LISTED} more files not cached")
        res.phase = "Complete" if not missing else "Failed" if named or not cancelled else "Cancelled"
    return WarmupResult(results, time.monotonic() - started, loaded, cancelled, in_flight)


def _listed(manifest, target: tuple[str, list[str]]) -> list[FileEntry]:
    """The entries of a listed target ``(label, [dataset path, ...])`` in its order. Raises
    ValueError naming (up to ``_MAX_LISTED``) the paths that are no files any more."""
    entries = [manifest.lookup(p) for p in target[1]]
    gone = [p for p, e in zip(target[1], entries) if e is None]
    if gone:
        more = f" and {len(gone) - _MAX_LISTED} more" if len(gone) > _MAX_LISTED else ""
        raise ValueError(f"{target[0]}: {len(gone)} files are no longer in the dataset "
                         f"({', '.join(gone[:_MAX_LISTED])}{more})")
    return entries


_EVICTED = "not cached (evicted: the cache quota is smaller than the target)"
_EVICTED_FULL = f"not cached (evicted: {DEVICE_FULL})"


def _device_full_count(source) -> int:
    """Writes of ``source``'s own tiered store that met a full device so far (0 for a source
    whose blocks live on cache workers: they report their own)."""
    return full_bypasses(getattr(source, "store", None))


def close_after(client, result: WarmupResult | None) -> None:
    """Close ``client`` once the segments ``result`` abandoned are done (at once when none are):
    closing its store under a running fill would fail that fill's write. The wait runs in a
    daemon thread, so an exiting process does not wait for it."""
    threads = result.in_flight if result is not None else ()
    if not threads:
        client.close()
        return

    def close() -> None:
        for t in threads:
            t.join()
        client.close()
    threading.Thread(target=close, name="datacache-warmup-close", daemon=True).start()


def _reason(err: Exception) -> str:
    """Why a file failed, in one line: ENOSPC's own text says why the cache did not keep it
    (quota, full device, unhealthy tier); a user's mistake (a missing secret) is its message."""
    if isinstance(err, OSError) and err.errno == errno.ENOSPC and err.strerror:
        return err.strerror
    if isinstance(err, DatacacheError):
        return str(err)
    return f"{type(err).__name__}: {getattr(err, 'strerror', None) or err}"


def _refresh(client, stale: set[str], errors: dict[str, str]) -> dict[str, FileEntry]:
    """Re-read the metadata of the ``stale`` files (changed in the UFS since the last sync, as a
    reader does on ESTALE): returns {dataset path: current entry} of those that still exist, and
    drops their first error from ``errors``; a file deleted meanwhile keeps a clear error."""
    fresh = {}
    for path in sorted(stale):
        try:
            entry = client.namespace.refresh_file(path)
        except OSError as err:
            errors[path] = f"changed in the UFS and could not be re-read: {_reason(err)}"
            continue
        if entry is None:
            errors[path] = "deleted in the UFS since the last metadata sync"
        else:
            errors.pop(path, None)
            fresh[path] = entry
    return fresh


def _segments(entry: FileEntry, block_size: int, segment_bytes: int):
    per = max(segment_bytes // block_size, 1)
    n = block_count(entry.size, block_size)
    for first in range(0, n, per):
        yield first, min(first + per, n) - 1


def _load(client, entries, owners, parallel, segment_bytes, progress, on_progress, cancel,
          check: bool, bulk: bool) -> tuple[dict[str, str], set[str], tuple[threading.Thread, ...]]:
    """Run all segments (``bulk``: stored around the page cache), counting each into ``progress``
    and the TargetProgress of each target in ``owners[path]``; returns {dataset path: error
    message} for files that failed, the paths of those that failed because the file changed in
    the UFS (ESTALE), and the segment threads
    abandoned after a cancel (still running)."""
    source, bs = client.source, client.block_size
    # Few large files would otherwise be a few long GETs on a few connections: cut segments so the
    # whole load has at least ~2 per thread in flight (each still at least one block; ~4 had 56
    # files of 8 MiB fetched in 112 GETs of one block, 1.27-1.61 s against 1.16-1.50 s for 56
    # whole-file GETs from S3 behind the delay proxy, this project's 2-CPU VM, four pairs: each
    # GET costs the store, the proxy and this process CPU); and so that every thread's segment,
    # held twice while it is read (see LocalBlockSource.fill), fits in the memory budget together:
    # 8 MiB with 16 threads and 256 MiB, where 32 MiB segments had the process peak at 566 MiB
    # warming up one 1.5 GiB file.
    fits = source.readahead.budget.limit // (FILL_COPIES * parallel) // bs * bs
    segment_bytes = min(segment_bytes, max(bs, sum(e.size for e in entries) // (parallel * 2)), max(bs, fits))
    errors: dict[str, str] = {}
    stale: set[str] = set()
    remaining = {e.path: block_count(e.size, bs) for e in entries}
    lock = threading.Lock()
    ufs_before = source.ufs_bytes
    cancel = cancel or threading.Event()
    abandoned = False  # set under ``lock``: late segments then report nothing

    def job(entry: FileEntry, first: int, last: int) -> None:
        if cancel.is_set():  # queued before the cancel: dropped
            return
        try:
            if entry.path not in errors:
                source.fill(entry, first, last, check, bulk)
        except Exception as err:  # the file's failure, never the thread's: the load goes on
            errors.setdefault(entry.path, _reason(err))
            if isinstance(err, StaleFileError):
                stale.add(entry.path)
        with lock:
            if abandoned:
                return
            remaining[entry.path] -= last - first + 1
            _count(progress, owners[entry.path], min((last + 1) * bs, entry.size) - first * bs,
                   remaining[entry.path] == 0)
            progress.bytes_loaded = source.ufs_bytes - ufs_before
            if on_progress is not None:
                on_progress(progress)

    pool = _SegmentPool(parallel, job, cancel)
    for entry in entries:
        if cancel.is_set():
            break
        if entry.size == 0:
            with lock:
                _count(progress, owners[entry.path], 0, True)
            continue
        for first, last in _segments(entry, bs, segment_bytes):
            if not pool.submit(entry, first, last):
                break
    in_flight = pool.finish()
    with lock:
        abandoned = True
    if on_progress is not None:
        on_progress(progress)
    return errors, stale, in_flight


class _SegmentPool:
    """``parallel`` daemon threads running ``job(*segment)`` from a queue bounded to ``4 *
    parallel`` segments (memory stays flat for huge lists). Not a ThreadPoolExecutor: its threads
    are joined at interpreter exit, so a cancelled CLI would wait for every GET in flight."""

    def __init__(self, parallel: int, job: Callable[..., None], cancel: threading.Event):
        self._queue: Queue = Queue(parallel * 4)
        self._job, self._cancel = job, cancel
        self._threads = [threading.Thread(target=self._run, name=f"datacache-warmup-{i}", daemon=True)
                         for i in range(parallel)]
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        while not self._cancel.is_set():  # a cancel ends every thread at its next segment
            try:
                segment = self._queue.get(timeout=0.1)
            except Empty:
                continue
            if segment is None:
                return
            self._job(*segment)

    def submit(self, *segment) -> bool:
        """Queue a segment (waits while the queue is full); False once cancelled."""
        return self._put(segment)

    def finish(self) -> tuple[threading.Thread, ...]:
        """Wait for the queued segments; after a cancel, for at most ``CANCEL_GRACE_S`` more.
        Returns the threads still running then (abandoned)."""
        for _ in self._threads:
            if not self._put(None):
                break  # cancelled: the threads end by themselves
        deadline = None
        for t in self._threads:
            while t.is_alive():
                if self._cancel.is_set():
                    deadline = deadline or time.monotonic() + CANCEL_GRACE_S
                    if time.monotonic() >= deadline:
                        return tuple(t for t in self._threads if t.is_alive())
                t.join(0.05)
        return ()

    def _put(self, item) -> bool:
        while not self._cancel.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except Full:
                pass
        return False


def _count(progress: Progress, targets: list[TargetProgress], nbytes: int, file_done: bool) -> None:
    """Add ``nbytes`` (and a finished file) to the overall counters and to each of ``targets``."""
    for counters in (progress, *targets):
        counters.bytes_done += nbytes
        counters.files_done += file_done
