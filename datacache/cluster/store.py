"""A worker's disk tier, able to hand out a block's file and checksum for zero-copy serving.

The worker serves disk blocks with ``sendfile`` (aiohttp ``FileResponse``), so the bytes never pass
through Python and the worker cannot verify them on the way out. It sends the checksum stored with
the block instead (``X-Block-Checksum``) and the client verifies it: integrity is still checked on
every read, end to end, at the one place that has the bytes anyway.

A disk hit looks the block up without writing to the index (diskcache's LRU policy would write the
access time on every read: an SQLite transaction on the event loop per block served); the worker
writes the access times of the blocks served in one transaction per ``ACCESS_FLUSH_S`` seconds.
"""

from __future__ import annotations

import os
import threading
import time

from datacache.cache.disk import DiskTier

ACCESS_FLUSH_S = 1.0


class ServingDiskTier(DiskTier):
    """DiskTier plus :meth:`open_block`, :meth:`flush_accesses` and :meth:`discard`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._accessed: set[str] = set()  # keys served since the last flush_accesses
        self._accessed_lock = threading.Lock()

    def open_block(self, key: str) -> tuple[str, str] | None:
        """``(path of the block file, xxh3 checksum)`` of a stored block, or None when absent.

        A read-only index lookup, cheap enough for an event loop; the access is recorded for LRU
        by the next :meth:`flush_accesses`. The file may still be evicted right after; callers
        that open it later must handle ``FileNotFoundError``.
        """
        handle, tag = self._peek.get(key, read=True, tag=True)
        if handle is None:
            return None
        handle.close()
        with self._accessed_lock:
            self._accessed.add(key)
        return handle.name, tag

    def flush_accesses(self) -> int:
        """Write the access times of the blocks :meth:`open_block` handed out since the last call
        (one transaction; the LRU order eviction follows is then at most one flush late).
        Returns how many blocks were marked."""
        with self._accessed_lock:
            accessed, self._accessed = self._accessed, set()
        if accessed:
            now = time.time()
            with self._cache.transact():  # diskcache's own LRU column, as DiskTier's eviction reads it
                self._cache._con.executemany("UPDATE Cache SET access_time = ? WHERE key = ? AND raw = 1",
                                             [(now, k) for k in accessed])
        return len(accessed)

    def discard(self, key: str) -> None:
        """Drop one block (handed off to its owner); no error when it is already gone."""
        with self._exclusive():
            self._cache.delete(key)


def worker_dir(level_dir: str, worker_id: str) -> str:
    """Cache directory of ``worker_id`` under a runtime's level directory."""
    return os.path.join(level_dir, worker_id)
