"""One memory budget for read-ahead and in-flight fills (bytes), shared by every open file."""

from __future__ import annotations

import threading


class MemoryBudget:
    """Counts bytes held by fills in flight; ``limit`` bytes at most.

    ``acquire(n, blocking=False)`` returns False instead of waiting, so read-ahead is simply
    skipped when the budget is spent. A demand read (``blocking=True``) waits; a single request
    larger than the whole budget is admitted alone so it can never deadlock.
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        self.peak = 0
        self._cond = threading.Condition()

    def acquire(self, n: int, blocking: bool = True) -> bool:
        with self._cond:
            while self.used and self.used + n > self.limit:
                if not blocking:
                    return False
                self._cond.wait()
            self.used += n
            self.peak = max(self.peak, self.used)
            return True

    def hold(self, n: int) -> bool:
        """Take ``n`` bytes for data kept between reads (an open file's current block) only while
        half the budget stays free: fills in flight always finish and release, kept blocks may not,
        so they must never starve a demand read. Returns False (taking nothing) otherwise."""
        with self._cond:
            if self.used + n > self.limit // 2:
                return False
            self.used += n
            self.peak = max(self.peak, self.used)
            return True

    def release(self, n: int) -> None:
        with self._cond:
            self.used -= n
            self._cond.notify_all()
