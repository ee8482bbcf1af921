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
  what the epoch reads next; a plan's eviction by next use is the tool there);
- a sample of ``sample`` of the tree's files must have at least ``cold_fraction`` of them not
  cached (a warm epoch starts nothing);
- one scan warmup per dataset and node at a time (``flock`` on ``lock_path``: several reading
  processes of a node, e.g. DataLoader workers reading ``datacache://``, start one), and a tree
  is warmed once per manifest snapshot by a process;
- while a published plan is followed (``standby``), it does nothing.
Users turn it off with the runtime's ``fuse.scanWarmup: false``. Shuffled-order prefetching of the
whole epoch at its start is what data-loading caches for training do (e.g. Quiver, FAST '20; NoPFS,
SC '21), with the order given; here the order is not needed because the tree fits the cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import posixpath
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from datacache.manifest import FileEntry
from datacache.warmup import warmup

log = logging.getLogger(__name__)

TRIGGER_FILES = 16  # distinct files first read within WINDOW_S before a tree counts as scanned
WINDOW_S = 30.0
SAMPLE_FILES = 16  # files of the tree checked for being cached before a warmup starts
COLD_FRACTION = 0.25  # of the sample not cached: the scan is cold
CAPACITY_FRACTION = 0.5  # of the cache's capacity: the largest tree warmed
PARALLEL = 16  # the warmup's loads in flight (the readers' own reads come on top)
CLOSE_WAIT_S = 2.0  # how long close() waits for abandoned loads before the store closes


class ScanWarmup:
    """``on_read`` listener of ``client`` (a DatasetClient); ``lock_path``: a file whose ``flock``
    makes one scan warmup per dataset and node run at a time; ``standby``: True while something
    better prefetches (a plan is followed). ``trigger``, ``window`` (seconds), ``sample``,
    ``cold_fraction``, ``capacity_fraction``, ``parallel``: see the module doc.
    ``started``: the trees (dataset paths, "" the root) whose warmup this listener ran.
    Thread-safe; per read a set lookup and a deque append under a lock."""

    def __init__(self, client, lock_path: str, standby: Callable[[], bool] = lambda: False, *,
                 trigger: int = TRIGGER_FILES, window: float = WINDOW_S, sample: int = SAMPLE_FILES,
                 cold_fraction: float = COLD_FRACTION, capacity_fraction: float = CAPACITY_FRACTION,
                 parallel: int = PARALLEL):
        self.client = client
        self.lock_path = lock_path
        self.standby = standby
        self.trigger = trigger
        self.window = window
        self.sample = sample
        self.cold_fraction = cold_fraction
        self.capacity_fraction = capacity_fraction
        self.parallel = parallel
        self.started: list[str] = []
        self._lock = threading.Lock()
        self._recent: OrderedDict[str, float] = OrderedDict()  # path -> when first read, oldest first
        self._done: set[str] = set()  # trees handled for this manifest snapshot
        self._manifest = None
        self._running: threading.Thread | None = None
        self._cancel = threading.Event()

    def __call__(self, entry: FileEntry) -> None:
        if self.standby() or self._cancel.is_set():
            return
        now = time.monotonic()
        with self._lock:
            manifest = self.client.manifest
            if manifest is not self._manifest:
                self._manifest = manifest
                self._recent.clear()
                self._done.clear()
            if entry.path in self._recent or self._covered(entry.path):
                return
            self._recent[entry.path] = now
            while self._recent and (len(self._recent) > self.trigger
                                    or next(iter(self._recent.values())) < now - self.window):
                self._recent.popitem(last=False)
            if len(self._recent) < self.trigger or (self._running is not None and self._running.is_alive()):
                return
            tree = _common_directory(self._recent)
            self._recent.clear()
            self._running = threading.Thread(target=self._run, args=(tree, manifest), daemon=True,
                                             name="datacache-scan-warmup")
        self._running.start()

    def _covered(self, path: str) -> bool:
        """Whether ``path`` is under a tree already handled (under the lock)."""
        return any(not tree or path.startswith(tree + "/") for tree in self._done)

    def _run(self, tree: str, manifest) -> None:
        entries = manifest.select(tree)
        size = sum(e.size for e in entries)
        label = f"dataset {self.client.name!r} under {tree or '/'!r}"
        try:
            _used, capacity = self.client.source.usage()
            if size > self.capacity_fraction * capacity:
                log.info("scan of %s: %d files, %d bytes, more than %.0f%% of the cache's %d bytes: not warmed",
                         label, len(entries), size, self.capacity_fraction * 100, capacity)
                return self._handled(tree)
            picked = random.sample(entries, min(self.sample, len(entries)))
            cold = sum(not self.client.source.is_cached(e, 0) for e in picked if e.size)
            if cold < self.cold_fraction * len(picked):
                return self._handled(tree)
            with _exclusive(self.lock_path) as mine:
                if not mine:  # another process of this node warms this dataset: the next trigger looks again
                    return
                log.info("scan of %s: warming its %d files (%d bytes) in the background", label, len(entries), size)
                self._handled(tree)
                self.started.append(tree)
                result = warmup(self.client, [tree], parallel=self.parallel, cancel=self._cancel)
                for t in result.in_flight:
                    t.join(CLOSE_WAIT_S)
            log.info("scan warmup of %s: %s in %.1f s, %d bytes loaded", label,
                     "cancelled" if result.cancelled else "done" if result.ok else "incomplete",
                     result.duration, result.loaded_bytes)
        except (OSError, RuntimeError) as err:  # RuntimeError: the source's pools are shut down (closing)
            log.debug("scan warmup of %s stopped: %s", label, err)

    def _handled(self, tree: str) -> None:
        with self._lock:
            if self.client.manifest is self._manifest:
                self._done.add(tree)

    def wait(self, timeout: float | None = None) -> None:
        """Block until the running warmup (if any) ends, or ``timeout`` seconds pass."""
        running = self._running
        if running is not None:
            running.join(timeout)

    def close(self) -> None:
        """Cancel a running warmup and wait for it (loads abandoned by the cancel get
        ``CLOSE_WAIT_S`` seconds more), so the store closes after it."""
        self._cancel.set()
        self.wait()


def _common_directory(paths) -> str:
    """The deepest directory holding every one of ``paths`` (dataset paths; "" the root)."""
    parents = {posixpath.dirname(p) for p in paths}
    return "" if "" in parents else posixpath.commonpath(parents)


@contextlib.contextmanager
def _exclusive(path: str):
    """Yield True holding an exclusive ``flock`` on ``path`` (created 0600), False when another
    process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
