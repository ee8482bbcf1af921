"""Client-side read-ahead for remote blocks: fetches started early, kept until read or dropped.

A local block source reads ahead by filling its own store; a remote one has no store on the
client, so the next blocks of a sequential read are fetched in the background into a small buffer
of futures. Each fetch holds its bytes against the shared memory budget (taken without waiting,
so read-ahead is skipped when the budget is spent) until the block is read or dropped; the buffer
keeps at most ``limit`` blocks, dropping the oldest, so abandoned read-ahead cannot pile up.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

from datacache.cache.budget import MemoryBudget


class ReadAhead:
    """Background fetches by key; ``threads`` fetches run at once."""

    def __init__(self, budget: MemoryBudget, block_size: int, threads: int = 4, most: int = 16):
        self.budget = budget
        self.limit = max(1, min(most, budget.limit // (2 * block_size)))  # never half the budget
        self._pending: OrderedDict[str, tuple[Future, int]] = OrderedDict()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="datacache-readahead")
        self._lock = threading.Lock()

    def start(self, key: str, nbytes: int, fetch, *args) -> None:
        """Run ``fetch(*args)`` (returning a tuple, bytes first) for ``key`` unless already started or
        the budget cannot hold ``nbytes`` more."""
        with self._lock:
            if key in self._pending or not self.budget.acquire(nbytes, blocking=False):
                return
            if len(self._pending) >= self.limit:
                self._release(*self._pending.popitem(last=False)[1])
            self._pending[key] = (self._pool.submit(fetch, *args), nbytes)

    def take(self, key: str):
        """What the fetch of ``key`` returned (waiting for it if still in flight), or None when it
        was not started or failed (the caller then reads it itself and meets the error there)."""
        with self._lock:
            found = self._pending.pop(key, None)
        if found is None:
            return None
        fut, nbytes = found
        try:
            return fut.result()
        except Exception:
            return None
        finally:
            self._release(fut, nbytes)

    def _release(self, fut: Future, nbytes: int) -> None:
        fut.add_done_callback(lambda _: self.budget.release(nbytes))

    def close(self) -> None:
        """Cancel what has not started and give back every byte held."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            for fut, nbytes in self._pending.values():
                self._release(fut, nbytes)
            self._pending.clear()
