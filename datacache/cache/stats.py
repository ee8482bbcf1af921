"""Cache hit counters per dataset, shared by every process using one cache directory.

Counted in memory and added to a small diskcache (no eviction) at most once a second and on close,
so the read path pays no database write per block. The diskcache opens at its first use: a process
that counts nothing (``datacache warmup``: its fills are no reader's requests) never opens it
(15-16 ms here, of the 30-36 ms before a warmup's first GET).
``cacheHitRatio`` = hits / (hits + misses), counted per block requested by readers (read-ahead is
not counted), as Fluid reports it. Hits served by a cache worker on another node are also counted
apart (``remote``), for ``remoteHitRatio``.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter

import diskcache

from datacache import private


class HitStats:
    """Counters ``hits``/``misses`` per dataset stored under ``path``."""

    def __init__(self, path: str, flush_every: float = 1.0):
        self._path = path
        self._opened: diskcache.Cache | None = None
        self._pending: Counter = Counter()
        self._lock = threading.Lock()
        self._flush_every = flush_every
        self._last = time.monotonic()

    @property
    def _db(self) -> diskcache.Cache:
        with self._lock:
            if self._opened is None:
                private.makedirs(self._path)
                self._opened = diskcache.Cache(self._path, eviction_policy="none")
                for name in os.listdir(self._path):
                    os.chmod(os.path.join(self._path, name), private.FILE_MODE)
            return self._opened

    def count(self, dataset: str, hit: bool, remote: bool = False) -> None:
        """Count one block read: a hit (``remote``: served by a worker on another node) or a miss."""
        with self._lock:
            self._pending[(dataset, "hits" if hit else "misses")] += 1
            if hit and remote:
                self._pending[(dataset, "remote")] += 1
        if time.monotonic() - self._last > self._flush_every:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, Counter()
            self._last = time.monotonic()
        for (dataset, name), n in pending.items():
            self._db.incr(f"{dataset}/{name}", n)

    def get(self, dataset: str) -> tuple[int, int]:
        """``(hits, misses)`` stored so far (after this process's pending counts are flushed)."""
        self.flush()
        return self._db.get(f"{dataset}/hits", 0), self._db.get(f"{dataset}/misses", 0)

    def remote_hits(self, dataset: str) -> int:
        """Hits (counted in ``get``'s hits too) served by a cache worker on another node."""
        self.flush()
        return self._db.get(f"{dataset}/remote", 0)

    def reset(self, dataset: str) -> None:
        self.flush()
        for name in ("hits", "misses", "remote"):
            self._db.delete(f"{dataset}/{name}")

    def close(self) -> None:
        self.flush()
        if self._opened is not None:
            self._opened.close()
