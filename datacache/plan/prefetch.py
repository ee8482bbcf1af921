"""Prefetch by the plan: files loaded in plan order, a bounded distance ahead of the reader.

Threads take the plan's files in order and fill them into the cache (one UFS read per file, the
source's ``fill``, which skips what is cached, holds the bytes against the memory budget while
they are in flight and stores them in the tiered store). They stay a window ahead of the
reader's position (the files loaded or loading past it; the next file is always allowed): what
the measured read rate and fill time call for (:class:`Pace`), never more than ``ahead_bytes``,
which :func:`ahead_bound` keeps well inside the disk quota. As the reader moves the window slides.
A file read out of plan order is read as any other, from the cache or the UFS.
"""

from __future__ import annotations

import logging
import threading
import time

from datacache.cache.blocks import block_count
from datacache.plan.cursor import PlanCursor

log = logging.getLogger(__name__)
THREADS = 16  # files loading at once: a 20 ms request latency needs several in flight
_MAX_AHEAD = 1 << 30


SAFETY = 4  # the window holds this many times what the reader consumes while one fill completes
RATE_S = 0.5  # the reader's rate is measured over at least this long: positions come in steps


class Pace:
    """The reader's pace (plan files a second) and a fill's duration (seconds), measured, and
    the window of prefetch they call for (:meth:`window`). ``clock``: seconds, monotonic. One
    per rank, kept from one plan to the next (:meth:`restart`): the next epoch is read at the
    pace of the last, and its first files need the window at once."""

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self.rate: float | None = None  # plan files a second the reader's position advances
        self.fetch_s: float | None = None  # seconds a fill from the UFS takes (moving average)
        self._mark: tuple[float, int] | None = None  # (time, position) the rate is measured from

    def restart(self) -> None:
        """A new plan: positions start again (the rate and fill time measured so far stay)."""
        self._mark = None

    def at(self, position: int) -> None:
        """The reader's position is ``position`` now."""
        now = self._clock()
        if self._mark is None:
            self._mark = (now, position)
            return
        t0, p0 = self._mark
        if now - t0 >= RATE_S:
            rate = (position - p0) / (now - t0)
            self.rate = rate if self.rate is None else (self.rate + rate) / 2
            self._mark = (now, position)

    def fetched(self, seconds: float) -> None:
        """A fill from the UFS took ``seconds``."""
        self.fetch_s = seconds if self.fetch_s is None else 0.8 * self.fetch_s + 0.2 * seconds

    def window(self, threads: int, mean_size: float, bound: int, floor: int, lag_s: float = 0.0) -> int:
        """Bytes of plan to have loaded or loading ahead of the reader's known position: the
        files it reads while one fill completes, ``SAFETY`` times over, and at least one a
        thread (all busy), at ``mean_size`` bytes a file; ``bound`` until both figures are
        measured; clamped to ``[floor, bound]``; plus what the reader reads in ``lag_s``
        seconds, the age the known position may have (other processes report theirs at each
        poll): bytes ahead of where the reader really is stay within the bound, and a window
        measured from an old position does not shrink to nothing (seen: a 4 MiB bound, 120 files
        a second read, positions up to 0.4 s old; a third of the reads missed). The source's
        latency and bandwidth come in through the fill's time."""
        if self.rate is None or self.fetch_s is None:
            return bound
        files = max(self.rate * self.fetch_s * SAFETY, threads)
        return int(min(bound, max(floor, files * mean_size)) + self.rate * lag_s * mean_size)


def ahead_bound(capacity: int, block_size: int) -> int:
    """Bytes of plan loaded ahead of the reader at most: a quarter of the cache's capacity
    (bytes), capped at 1 GiB, never below one block. The rest of the quota keeps the files the
    plan needs again soonest (see :mod:`.nextuse`)."""
    return max(block_size, min(capacity // 4, _MAX_AHEAD))


class Prefetcher:
    """Loads ``cursor``'s files through ``source`` (a block source), ``ahead_bytes`` at most past
    the reader's position (known up to ``lag_s`` seconds late: :meth:`Pace.window`; ``pace``:
    the rank's, measured over its earlier plans), on ``threads`` daemon threads. :meth:`moved`
    after the position changes; :meth:`stop` when the plan is replaced. ``loaded``: files filled
    (read from the UFS or found cached); ``peak_ahead``: the most bytes of plan ever past the
    reader's position (loaded or loading), for tests and figures."""

    def __init__(self, source, cursor: PlanCursor, ahead_bytes: int, threads: int = THREADS, lag_s: float = 0.0,
                 pace: Pace | None = None):
        self.source = source
        self.cursor = cursor
        self.ahead_bytes = ahead_bytes
        self.lag_s = lag_s
        self.loaded = 0
        self.peak_ahead = 0
        self.pace = pace or Pace()
        self.pace.restart()
        self._mean = cursor.offsets[-1] / max(len(cursor), 1)
        self._next = 0
        self._stopped = False
        self._cond = threading.Condition()
        self._threads = [threading.Thread(target=self._run, daemon=True, name=f"datacache-plan-{i}")
                         for i in range(threads)]
        for t in self._threads:
            t.start()

    def moved(self) -> None:
        """The reader's position moved: the window slides (one waiting thread is woken; each
        that takes a file wakes the next, so a read costs one wake-up, not one per thread)."""
        with self._cond:
            self.pace.at(self.cursor.position)
            self._cond.notify()

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
                limit = self.pace.window(len(self._threads), self._mean, self.ahead_bytes, self.source.block_size,
                                         self.lag_s)
                if nxt == first or ahead <= limit:
                    self._next = nxt + 1
                    self.peak_ahead = max(self.peak_ahead, ahead)
                    self._cond.notify()  # the window may have room for one more
                    return self.cursor.entries[nxt]
                self._cond.wait(1.0)
            return None

    def _run(self) -> None:
        while (entry := self._take()) is not None:
            n = block_count(entry.size, self.source.block_size)
            try:
                t0 = time.monotonic()
                if n and self.source.fill(entry, 0, n - 1):  # bytes read from the UFS: a fill's time
                    self.pace.fetched(time.monotonic() - t0)
                self.loaded += 1
            except Exception as err:  # a demand read will meet (and report) it; or closed under us
                if self._stopped:
                    return
                log.info("plan prefetch of %s skipped: %s", entry.path, err)
