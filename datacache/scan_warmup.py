"""Scan warmup: a cold epoch over a tree of files gets the rest of the tree loaded in parallel.

A training epoch reads every file of its tree once, in a shuffled order. Cold, each read waits for
one GET (about 30 ms from a remote store), and a DataLoader keeps only as many reads in flight as
it has workers: 4 workers read 100 KB JPEGs at ~130 files/s whatever the cache does per file
(the benchmarks' cold epoch, for datacache and JuiceFS alike). Read-ahead by name order
(:mod:`datacache.file_readahead`) cannot guess a shuffled order and a published plan
(:mod:`datacache.plan`) needs the training code to publish one. What is known without either: an
epoch touches many distinct files of one directory tree within seconds. :class:`ScanWarmup` is an
``on_read`` listener of a :class:`~datacache.dataset_client.DatasetClient` that, once ``trigger``
distinct files were first read within ``window`` seconds, takes their deepest common directory as
the tree being scanned and runs a warmup (:func:`datacache.warmup.warmup`, ``parallel`` loads)
of that tree in a background thread, so the reads still to come find their files cached.

It stays out of the way where that would be wrong:
- the tree must fit in ``capacity_fraction`` of the cache's capacity (a larger one would evict
  what the epoch reads next; a plan's eviction by next use is the tool there); a subtree of a
  tree too large is still considered when a later window's reads all fall in it;
- at least ``min_fraction`` of the tree's non-empty files must have been read (a look at 16 files of a tree
  of 3,000 loads nothing; an epoch over 75,000 files starts its warmup after 1,500);
- a sample of up to ``sample`` of the tree's files (empty ones left out) must have at least
  ``cold_fraction`` of them not cached (a warm epoch starts nothing);
- one scan warmup per dataset and node at a time (``flock`` on ``lock_path``: several reading
  processes of a node, e.g. DataLoader workers reading ``datacache://``, start one; the lock is
  released explicitly, so a child forked meanwhile does not keep it), and a tree is warmed once
  per manifest snapshot by a process; while one runs, reads start nothing new;
- while a published plan is followed (``standby``), it does nothing.
Users turn it off with the runtime's ``fuse.scanWarmup: false``. Shuffled-order prefetching of the
whole epoch at its start is what data-loading caches for training do (e.g. Quiver, FAST '20; NoPFS,
SC '21), with the order given; here the order is not needed because the tree fits the cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import math
import os
import posixpath
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from datacache.manifest import FileEntry
from datacache.warmup import warmup

log = logging.getLogger(__name__)

TRIGGER_FILES = 16  # distinct files first read within WINDOW_S before their tree counts as scanned
WINDOW_S = 30.0
MIN_FRACTION = 0.02  # of the tree's files read before it is warmed
SAMPLE_FILES = 16  # files of the tree checked for being cached before a warmup starts
COLD_FRACTION = 0.25  # of the sample not cached: the scan is cold
CAPACITY_FRACTION = 0.5  # of the cache's capacity: the largest tree warmed
PARALLEL = 16  # the warmup's loads in flight (the readers' own reads come on top)
CLOSE_WAIT_S = 2.0  # how long close() waits for loads abandoned by its cancel, all together


class ScanWarmup:
    """``on_read`` listener of ``client`` (a DatasetClient); ``lock_path``: a file whose ``flock``
    makes one scan warmup per dataset and node run at a time; ``standby``: True while something
    better prefetches (a plan is followed). ``trigger``, ``window`` (seconds), ``min_fraction``,
    ``sample``, ``cold_fraction``, ``capacity_fraction``, ``parallel``: see the module doc.
    ``started``: the trees (dataset paths, "" the root) whose warmup this listener ran.
    Thread-safe; per read a few prefix checks and a dict insert under a lock."""

    def __init__(self, client, lock_path: str, standby: Callable[[], bool] = lambda: False, *,
                 trigger: int = TRIGGER_FILES, window: float = WINDOW_S, min_fraction: float = MIN_FRACTION,
                 sample: int = SAMPLE_FILES, cold_fraction: float = COLD_FRACTION,
                 capacity_fraction: float = CAPACITY_FRACTION, parallel: int = PARALLEL):
        self.client = client
        self.lock_path = lock_path
        self.standby = standby
        self.trigger = trigger
        self.window = window
        self.min_fraction = min_fraction
        self.sample = sample
        self.cold_fraction = cold_fraction
        self.capacity_fraction = capacity_fraction
        self.parallel = parallel
        self.started: list[str] = []
        self._lock = threading.Lock()
        self._recent: OrderedDict[str, float] = OrderedDict()  # path -> when first read, oldest first
        self._done: set[str] = set()  # trees warming, warmed or found warm: reads below them count nothing
        self._too_large: set[str] = set()  # trees larger than the share of the cache: a window on one is dropped
        self._watch: dict[str, tuple[int, set[str]]] = {}  # tree -> (files still to read, those read since)
        self._manifest = None
        self._running: threading.Thread | None = None
        self._cancel = threading.Event()

    def __call__(self, entry: FileEntry) -> None:
        if self.standby():
            return
        now, path = time.monotonic(), entry.path
        with self._lock:
            if self._cancel.is_set() or (self._running is not None and self._running.is_alive()):
                return
            manifest = self.client.manifest
            if manifest is not self._manifest:
                self._manifest = manifest
                self._recent.clear()
                self._done.clear()
                self._too_large.clear()
                self._watch.clear()
            if _under(path, self._done):
                return
            tree = next((t for t in self._watch if _under(path, {t})), None)
            if tree is not None:  # a tree known to need more reads first
                more, since = self._watch[tree]
                since.add(path)
                if len(since) < more:
                    return
                del self._watch[tree]
                reads = math.inf  # read enough now
            else:
                if path in self._recent:
                    return
                self._recent[path] = now
                while self._recent and (len(self._recent) > self.trigger
                                        or next(iter(self._recent.values())) < now - self.window):
                    self._recent.popitem(last=False)
                if len(self._recent) < self.trigger:
                    return
                tree, reads = _common_directory(self._recent), len(self._recent)
                self._recent.clear()
                if tree in self._too_large:
                    return
            self._done.add(tree)  # now, so reads of it while it is looked at do not start another
            self._running = threading.Thread(target=self._run, args=(tree, manifest, reads), daemon=True,
                                             name="datacache-scan-warmup")
            self._running.start()

    def _run(self, tree: str, manifest, reads: float) -> None:
        label = f"dataset {self.client.name!r} under {tree or '/'!r}"
        try:
            files, size = manifest.tree_size(tree)
            _used, capacity = self.client.source.usage()
            if size > self.capacity_fraction * capacity:
                log.info("scan of %s: %d files, %d bytes, more than %.0f%% of the cache's %d bytes: not warmed",
                         label, files, size, self.capacity_fraction * 100, capacity)
                return self._verdict(tree, manifest, too_large=True)
            needed = math.ceil(self.min_fraction * files)
            if reads < needed:  # a look at a few files, not (yet) a scan
                return self._verdict(tree, manifest, watch=(needed - reads, set()))
            picked = manifest.sample(tree, self.sample)
            if sum(not self.client.source.is_cached(e, 0) for e in picked) < self.cold_fraction * len(picked):
                return  # warm (or nothing to load): stays done
            with _exclusive(self.lock_path) as mine:
                if not mine:  # another process of this node warms this dataset: a later scan looks again
                    log.debug("scan of %s: another process warms this dataset now", label)
                    return self._verdict(tree, manifest)
                log.info("scan of %s: warming its %d files (%d bytes) in the background", label, files, size)
                self.started.append(tree)
                result = warmup(self.client, [tree], parallel=self.parallel, cancel=self._cancel)
                deadline = time.monotonic() + CLOSE_WAIT_S
                for t in result.in_flight:
                    t.join(max(0.0, deadline - time.monotonic()))
            failures = [f for t in result.targets for f in t.failures]
            log.info("scan warmup of %s: %s in %.1f s, %d bytes loaded%s", label,
                     "cancelled" if result.cancelled else "done" if result.ok else "incomplete",
                     result.duration, result.loaded_bytes,
                     f"; {len(failures)} failure(s), the first: {failures[0]}" if failures else "")
        except Exception as err:  # a background load never fails the reads; closing stops it with errors
            (log.debug if self._cancel.is_set() else log.warning)("scan warmup of %s stopped: %s", label, err)

    def _verdict(self, tree: str, manifest, too_large: bool = False,
                 watch: tuple[int, set[str]] | None = None) -> None:
        """``tree`` is not warmed now: reads below it count again, for a later window (its
        subtrees only, when ``too_large``) or towards ``watch`` (files still to read, those read)."""
        with self._lock:
            if manifest is not self._manifest:
                return
            self._done.discard(tree)
            if too_large:
                self._too_large.add(tree)
            elif watch is not None:
                self._watch[tree] = watch

    def wait(self, timeout: float | None = None) -> None:
        """Block until the running warmup (if any) ends, or ``timeout`` seconds pass."""
        with self._lock:
            running = self._running
        if running is not None:
            running.join(timeout)

    def close(self) -> None:
        """Cancel a running warmup and wait for it (loads abandoned by the cancel get
        ``CLOSE_WAIT_S`` seconds more, all together), so the store closes after it."""
        with self._lock:
            self._cancel.set()
        self.wait()


def _under(path: str, trees: set[str] | dict[str, object]) -> bool:
    """Whether dataset ``path`` is below one of ``trees`` ("" the root): a look-up per directory
    above it, not a scan of the trees (on every open of an epoch, once trees were warmed)."""
    if "" in trees:
        return True
    slash = path.find("/")
    while slash != -1:
        if path[:slash] in trees:
            return True
        slash = path.find("/", slash + 1)
    return False


def _common_directory(paths) -> str:
    """The deepest directory holding every one of ``paths`` (dataset paths; "" the root)."""
    parents = {posixpath.dirname(p) for p in paths}
    return "" if "" in parents else posixpath.commonpath(parents)


@contextlib.contextmanager
def _exclusive(path: str):
    """Yield True holding an exclusive ``flock`` on ``path`` (created 0600), False when another
    process holds it. Released with ``LOCK_UN``, not only by closing: a child forked meanwhile
    (a DataLoader worker) shares the lock's open file and would otherwise keep it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
