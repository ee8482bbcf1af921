"""Single-flight: one run of a piece of work per key at a time, its outcome shared.

The first caller of a key claims it and runs the work; callers that arrive while it runs get the
same :class:`concurrent.futures.Future` and its value or exception. Used for block fills by the
read-ahead component every block source loads through (:mod:`.readahead`, threads) and the
cache worker (asyncio, through ``asyncio.wrap_future``), so one missing block costs one UFS read however many readers ask. The
pattern and its name come from Go's ``golang.org/x/sync/singleflight``.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Callable


class SingleFlight:
    """Runs in flight, by key (any hashable; block keys are strings). Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._running: dict = {}

    def joined(self, key) -> Future | None:
        """The future of the run of ``key`` in flight, or None."""
        with self._lock:
            return self._running.get(key)

    def claim(self, key) -> tuple[Future, bool]:
        """``(future, mine)``: with ``mine`` the caller must run the work and :meth:`settle` it
        (or :meth:`run` it); otherwise it waits on the future of the run in flight."""
        with self._lock:
            fut = self._running.get(key)
            if fut is not None:
                return fut, False
            fut = self._running[key] = Future()
            return fut, True

    def settle(self, key, fut: Future, result=None, error: BaseException | None = None) -> None:
        """Hand ``result`` (or raise ``error``) to every waiter of ``fut``, then forget ``key``."""
        try:
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)
        finally:
            with self._lock:
                if self._running.get(key) is fut:
                    del self._running[key]

    def run(self, key, fut: Future, work: Callable[[], object]) -> None:
        """``work()``, its value or exception settled on ``fut`` (a claimed run)."""
        try:
            result = work()
        except BaseException as err:  # handed to every waiter
            self.settle(key, fut, error=err)
        else:
            self.settle(key, fut, result)
