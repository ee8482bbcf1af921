"""Prefetch by the plan: files loaded in plan order, a bounded distance ahead of the reader.

Threads take the plan's files in order and fill them into the cache (one UFS read per file, the
source's ``fill``, which skips what is cached, holds the bytes against the memory budget while
they are in flight and stores them in the tiered store). They stay at most ``ahead_bytes`` of
plan ahead of the reader's position (the files loaded or loading past it; the next file is
always allowed), so the data prefetched and not yet read stays within that bound, which
:func:`ahead_bound` keeps well inside the disk quota. As the reader moves the window slides.
A file read out of plan order is read as any other, from the cache or the UFS.
"""

from __future__ import annotations

import logging
import threading

from datacache.cache.blocks import block_count
from datacache.plan.cursor import PlanCursor

log = logging.getLogger(__name__)
THREADS = 16  # files loading at once: a 20 ms request latency needs several in flight
_MAX_AHEAD = 1 << 30


def ahead_bound(capacity: int, block_size: int) -> int:
    """Bytes of plan loaded ahead of the reader at most: a quarter of the cache's capacity
    (bytes), capped at 1 GiB, never below one block. The rest of the quota keeps the files the
    plan needs again soonest (see :mod:`.nextuse`)."""
    return max(block_size, min(capacity // 4, _MAX_AHEAD))


class Prefetcher:
    """Loads ``cursor``'s files through ``source`` (a block source), ``ahead_bytes`` at most past
    the reader's position, on ``threads`` daemon threads. :meth:`moved` after the position
    changes; :meth:`stop` when the plan is replaced. ``loaded``: files filled (read from the UFS
    or found cached); ``peak_ahead``: the most bytes of plan ever past the reader's position
    (loaded or loading), for tests and figures."""

    def __init__(self, source, cursor: PlanCursor, ahead_bytes: int, threads: int = THREADS):
        self.source = source
        self.cursor = cursor
        self.ahead_bytes = ahead_bytes
        self.loaded = 0
        self.peak_ahead = 0
        self._next = 0
        self._stopped = False
        self._cond = threading.Condition()
        self._threads = [threading.Thread(target=self._run, daemon=True, name=f"datacache-plan-{i}")
                         for i in range(threads)]
        for t in self._threads:
            t.start()

    def moved(self) -> None:
        """The reader's position moved: the window slides."""
        with self._cond:
            self._cond.notify_all()

    def stop(self, wait: float = 0.0) -> None:
        """Take no further file; wait up to ``wait`` seconds for the fills in flight (before
        the store closes)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        for t in self._threads:
            t.join(wait)

    def _take(self):
        """The next file to load, when the window has room (waits for it); None once stopped or
        past the plan's end."""
        offsets = self.cursor.offsets
        with self._cond:
            while not self._stopped:
                first = self.cursor.position + 1  # the reader's next file
                nxt = max(self._next, first)
                if nxt >= len(self.cursor):
                    return None
                ahead = offsets[nxt + 1] - offsets[first]
                if nxt == first or ahead <= self.ahead_bytes:
                    self._next = nxt + 1
                    self.peak_ahead = max(self.peak_ahead, ahead)
                    return self.cursor.entries[nxt]
                self._cond.wait(1.0)
            return None

    def _run(self) -> None:
        while (entry := self._take()) is not None:
            n = block_count(entry.size, self.source.block_size)
            try:
                if n:
                    self.source.fill(entry, 0, n - 1)
                self.loaded += 1
            except Exception as err:  # a demand read will meet (and report) it; or closed under us
                if self._stopped:
                    return
                log.info("plan prefetch of %s skipped: %s", entry.path, err)
