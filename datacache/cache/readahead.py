"""Read-ahead: the one component every block source and the Reader load blocks ahead through.

It owns, per block source:

- the memory budget (:class:`~datacache.cache.budget.MemoryBudget`, shared by every source of a
  process) that loads in flight and blocks kept ahead hold against;
- the single-flight (:class:`~datacache.cache.singleflight.SingleFlight`) of block loads by key,
  so one missing block costs one UFS read however many readers and hints ask (:meth:`load`);
- the buffer of blocks loaded but not read yet (:meth:`keep`, :meth:`take`, :meth:`drop`),
  bounded to the blocks that fit in half the budget, the oldest dropped first, so abandoned
  read-ahead cannot pile up; a kept block holds its bytes (``hold``: only while half the budget
  stays free for fills) until it is taken or dropped;
- two thread pools. *Fills* (``datacache-fill``) run work that never waits for a job queued in
  this component: a UFS read into the store, a fetch from a cache worker (whose fallback to the
  UFS may join a demand read already running in its caller's thread). *Loads*
  (``datacache-ahead``) run work that may wait for a fill: a Reader's load of its next block
  (``source.get``, which joins a fill in flight or takes a fetched block). A load therefore only
  ever waits for the other pool, whose jobs always finish: with one pool, loads waiting for
  fills queued behind them would take every thread and hang for good.

Work started after :meth:`close` is skipped (it is only ever read-ahead); fills cancelled by it
give their budget back and fail their waiters with ``ECANCELED``. The shape follows JuiceFS's
``pkg/chunk/prefetch.go`` (a fixed number of fetchers, one fetch per key at a time) and Go's
``singleflight``; the second pool is this project's, for loads that wait.
"""

from __future__ import annotations

import errno
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from collections.abc import Callable, Hashable

from datacache.cache.budget import MemoryBudget
from datacache.cache.singleflight import SingleFlight

FILL_THREADS = 16  # fills (UFS reads, worker fetches) running at once, per source
LOAD_THREADS = 8  # Readers' loads of their next blocks running at once, per source


class ReadAhead:
    """Background loads of blocks of ``block_size`` bytes against ``budget``.

    ``fill_threads`` / ``load_threads``: the sizes of the two pools (module docstring; default
    :data:`FILL_THREADS` / :data:`LOAD_THREADS`). Keys are any hashable: block keys for loads and
    a source's fetched blocks, ``(token, index)`` for a Reader's blocks ahead. Thread-safe.
    """

    def __init__(self, budget: MemoryBudget, block_size: int, fill_threads: int | None = None,
                 load_threads: int | None = None):
        self.budget = budget
        self.block_size = block_size
        self.flights = SingleFlight()
        self._fills = ThreadPoolExecutor(fill_threads or FILL_THREADS, thread_name_prefix="datacache-fill")
        self._loads = ThreadPoolExecutor(load_threads or LOAD_THREADS, thread_name_prefix="datacache-ahead")
        self._kept: OrderedDict[Hashable, tuple[Future, int]] = OrderedDict()
        self._lock = threading.Lock()
        self._closed = False

    def load(self, key: Hashable, nbytes: int, work: Callable[[], object], wait: bool = True) -> Future | None:
        """Run ``work()`` for ``key`` once however many callers ask while it runs, holding ``nbytes``
        against the budget meanwhile; returns the run's future (its value or exception). With
        ``wait`` the caller waits for the budget and runs the work itself; else it runs in the fill
        pool, and nothing is started (None) when the budget has no room or after :meth:`close`.
        ``work`` must not wait for a job queued in this component (it may run in the fill pool)."""
        fut = self.flights.joined(key)
        if fut is not None:
            return fut
        # Never wait for the budget while a run is claimed: the runs that would release it may
        # wait for this one (a deadlock once a demand read had to wait).
        if (not wait and self._closed) or not self.budget.acquire(nbytes, blocking=wait):
            return None
        fut, mine = self.flights.claim(key)
        if not mine:  # another caller started this run meanwhile: share it
            self.budget.release(nbytes)
            return fut

        def run() -> None:
            try:
                self.flights.run(key, fut, work)
            finally:
                self.budget.release(nbytes)

        if wait:
            run()
            return fut

        def cancelled() -> None:
            self.budget.release(nbytes)
            self.flights.settle(key, fut, error=OSError(errno.ECANCELED, "read-ahead stopped: the source closed"))

        self._submit(self._fills, run, cancelled)
        return fut

    def keep(self, key: Hashable, nbytes: int, work: Callable[[], object], waits: bool = False) -> bool:
        """Start ``work()`` in the background and keep what it returns for :meth:`take`, holding
        ``nbytes`` until then. ``waits``: the work may wait for a fill (a Reader's ``source.get``),
        so it runs in the load pool; else in the fill pool. True when ``key`` is loading or kept
        now; False when the budget has no room (``hold``) or the component is closed. A new key
        finding the buffer at its bound drops the oldest kept one first."""
        with self._lock:
            if key in self._kept:
                return True
            if self._closed:
                return False
            while len(self._kept) >= max(1, self.budget.limit // (2 * self.block_size)):
                self._release(*self._kept.popitem(last=False)[1])
            if not self.budget.hold(nbytes):
                return False
            fut = (self._loads if waits else self._fills).submit(work)
            self._kept[key] = (fut, nbytes)
        return True

    def take(self, key: Hashable, release: bool = True):
        """What the work kept for ``key`` returned (waiting for it if it still runs), removed from
        the buffer; None when there is none, it failed or was dropped (the caller then loads the
        block itself and meets any error there). ``release``: give its bytes back to the budget;
        else the caller now holds them (``nbytes`` of :meth:`keep`) and releases them itself."""
        with self._lock:
            found = self._kept.pop(key, None)
        if found is None:
            return None
        fut, nbytes = found
        try:
            value = fut.result()
        except Exception:  # includes CancelledError: loaded again by the caller
            value = None
        if release or value is None:
            self.budget.release(nbytes)
        return value

    def ready(self, key: Hashable) -> bool:
        """Whether ``key`` is kept and landed with a value (a take costs no I/O)."""
        with self._lock:
            found = self._kept.get(key)
        if found is None or not found[0].done() or found[0].cancelled():
            return False
        return found[0].exception() is None and found[0].result() is not None

    def drop(self, key: Hashable) -> None:
        """Forget ``key``'s kept block: not started yet, it never runs; else its bytes are given
        back when it lands (never waited for: the caller may be FUSE's event loop)."""
        with self._lock:
            found = self._kept.pop(key, None)
        if found is not None:
            self._release(*found)

    def later(self, fn: Callable, *args) -> None:
        """Run ``fn(*args)`` in the load pool (read-ahead hints, off the caller's thread); skipped
        after :meth:`close`."""
        self._submit(self._loads, lambda: fn(*args))

    def close(self) -> None:
        """Stop: loads not started never run, running ones finish (their fills still run), then
        fills not started are cancelled; every byte kept is given back. Idempotent."""
        with self._lock:
            self._closed = True
            kept, self._kept = self._kept, OrderedDict()
        for fut, nbytes in kept.values():
            self._release(fut, nbytes)
        self._loads.shutdown(wait=True, cancel_futures=True)
        self._fills.shutdown(wait=True, cancel_futures=True)

    def _release(self, fut: Future, nbytes: int) -> None:
        if fut.cancel():
            self.budget.release(nbytes)
        else:
            fut.add_done_callback(lambda _: self.budget.release(nbytes))

    def _submit(self, pool: ThreadPoolExecutor, job: Callable[[], None], cancelled: Callable[[], None] | None = None):
        try:
            fut = pool.submit(job)
        except RuntimeError:  # shut down by close() meanwhile
            fut = Future()
            fut.cancel()
        if cancelled is not None:
            fut.add_done_callback(lambda f: f.cancelled() and cancelled())
