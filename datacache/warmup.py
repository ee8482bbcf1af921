"""Warmup (DataLoad) engine: prefetch a dataset's files into the cache before training.

Targets are dataset paths: a file, a directory (everything below) or a glob. Each file is cut into
segments of up to ``segment_bytes`` (smaller when the whole load is only a few segments per thread,
so one large object is still read by parallel GETs); a segment is one UFS read that fills several
blocks, so a large object costs a few large GETs and a small file one. Segments run ``parallel``
at a time (the UFS sees that many concurrent reads) and hold their bytes against the source's
memory budget.
Already-cached blocks are skipped (a block file gone or short is not cached: it is loaded again),
so a warmup is resumable. At the end every target is checked
against what the cache actually holds (case C13): Complete means 100 % of its current-version
bytes are cached; anything else is Failed with what is missing and why (cases C1, C9).
"""

from __future__ import annotations

import errno
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Callable

from datacache.cache.blocks import block_count
from datacache.manifest import FileEntry

_MAX_LISTED = 10


@dataclass
class TargetResult:
    """One target's outcome: ``files``/``bytes`` selected, ``cached_bytes`` held after the run,
    ``failures`` (messages), ``phase`` Complete | Failed."""

    path: str
    files: int = 0
    bytes: int = 0
    cached_bytes: int = 0
    failures: list[str] = field(default_factory=list)
    phase: str = "Pending"


@dataclass
class WarmupResult:
    targets: list[TargetResult]
    duration: float
    loaded_bytes: int

    @property
    def ok(self) -> bool:
        return all(t.phase == "Complete" for t in self.targets)


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


def warmup(client, targets: list[str] | None = None, *, parallel: int = 16, segment_bytes: int = 32 << 20,
           on_progress: Callable[[Progress], None] | None = None,
           cancel: threading.Event | None = None, check: bool = False) -> WarmupResult:
    """Load ``targets`` (default: the whole dataset) of ``client`` (a DatasetClient) into its cache.

    Blocks already held are skipped when their files are there at their size; with ``check``
    only when their bytes also pass their checksum (every cached block is read, as ``juicefs
    warmup --check``). Missing or damaged blocks are loaded again.

    Never raises for a bad target or a failed file: they are reported in the result. ``cancel``
    (set from another thread or a signal handler) stops scheduling new segments; segments in
    flight finish, each block is stored whole or not at all, so what is loaded stays loaded and
    a later run resumes from it.
    """
    started = time.monotonic()
    manifest = client.manifest
    results: list[TargetResult] = []
    selected: dict[str, FileEntry] = {}
    per_target: list[list[FileEntry]] = []
    for path in targets or [""]:
        res = TargetResult(path or "/")
        results.append(res)
        per_target.append([])
        try:
            entries = manifest.select(path)
        except ValueError as err:
            res.failures.append(str(err))
            continue
        if not entries and not manifest.is_dir(path):  # an empty directory is found: 0 files, Complete
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
    ufs_before = client.source.ufs_bytes
    file_errors = _load(client, list(selected.values()), owners, parallel, segment_bytes, progress, on_progress,
                        cancel, check)
    loaded = client.source.ufs_bytes - ufs_before

    for res, mine in zip(results, per_target):
        if res.failures:
            res.phase = "Failed"
            continue
        res.cached_bytes = client.cached_bytes(mine)
        missing = [e for e in mine if client.cached_fraction(e) < 1.0]
        unknown = ("not loaded: the load was cancelled" if cancel is not None and cancel.is_set()
                   else "not cached (evicted: the cache quota is smaller than the target)")
        for e in missing[:_MAX_LISTED]:
            res.failures.append(f"{e.path}: {file_errors.get(e.path, unknown)}")
        if len(missing) > _MAX_LISTED:
            res.failures.append(f"... and {len(missing) - _MAX_LISTED} more files not cached")
        res.phase = "Complete" if not missing else "Failed"
    return WarmupResult(results, time.monotonic() - started, loaded)


def _segments(entry: FileEntry, block_size: int, segment_bytes: int):
    per = max(segment_bytes // block_size, 1)
    n = block_count(entry.size, block_size)
    for first in range(0, n, per):
        yield first, min(first + per, n) - 1


def _load(client, entries, owners, parallel, segment_bytes, progress, on_progress, cancel,
          check: bool) -> dict[str, str]:
    """Run all segments, counting each into ``progress`` and the TargetProgress of each target in
    ``owners[path]``; returns {dataset path: error message} for files that failed."""
    source, bs = client.source, client.block_size
    # Few large files would otherwise be a few long GETs on a few connections: cut segments so the
    # whole load has at least ~4 per thread in flight (each still at least one block).
    segment_bytes = min(segment_bytes, max(bs, sum(e.size for e in entries) // (parallel * 4)))
    errors: dict[str, str] = {}
    remaining = {e.path: block_count(e.size, bs) for e in entries}
    lock = threading.Lock()
    ufs_before = source.ufs_bytes

    def job(entry: FileEntry, first: int, last: int) -> None:
        try:
            if entry.path not in errors:
                source.fill(entry, first, last, check)
        except OSError as err:
            # ENOSPC says why the cache did not keep it (quota, full device, unhealthy tier).
            reason = err.strerror if err.errno == errno.ENOSPC and err.strerror else f"{type(err).__name__}: {err.strerror or err}"
            errors.setdefault(entry.path, reason)
        with lock:
            remaining[entry.path] -= last - first + 1
            _count(progress, owners[entry.path], min((last + 1) * bs, entry.size) - first * bs,
                   remaining[entry.path] == 0)
            progress.bytes_loaded = source.ufs_bytes - ufs_before
            if on_progress is not None:
                on_progress(progress)

    with ThreadPoolExecutor(parallel, thread_name_prefix="datacache-warmup") as pool:
        pending = set()
        for entry in entries:
            if cancel is not None and cancel.is_set():
                break
            if entry.size == 0:
                with lock:
                    _count(progress, owners[entry.path], 0, True)
                continue
            for first, last in _segments(entry, bs, segment_bytes):
                if cancel is not None and cancel.is_set():
                    break
                if len(pending) >= parallel * 4:  # bounded queue: memory stays flat for huge lists
                    _, pending = wait(pending, return_when=FIRST_COMPLETED)
                pending.add(pool.submit(job, entry, first, last))
        wait(pending)
    if on_progress is not None:
        on_progress(progress)
    return errors


def _count(progress: Progress, targets: list[TargetProgress], nbytes: int, file_done: bool) -> None:
    """Add ``nbytes`` (and a finished file) to the overall counters and to each of ``targets``."""
    for counters in (progress, *targets):
        counters.bytes_done += nbytes
        counters.files_done += file_done
