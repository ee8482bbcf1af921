"""A worker's disk tier, able to hand out a block's file and checksum for zero-copy serving.

The worker serves disk blocks with ``sendfile`` from the file :meth:`open_block` opened, so the
bytes never pass through Python and the worker cannot verify them on the way out. It sends the
checksum stored with the block instead (``X-Block-Checksum``) and the client verifies it: integrity
is still checked on every read, end to end, at the one place that has the bytes anyway.

A disk hit looks the block up without writing to the index (diskcache's LRU policy would write the
access time on every read: an SQLite transaction on the event loop per block served); the worker
writes the access times of the blocks served in one transaction per ``ACCESS_FLUSH_S`` seconds.
"""

from __future__ import annotations

import os
from typing import BinaryIO

from datacache.cache.disk import ACCESS_FLUSH_S, DiskTier

__all__ = ["ACCESS_FLUSH_S", "ServingDiskTier", "worker_dir"]


class ServingDiskTier(DiskTier):
    """DiskTier plus :meth:`open_block` and :meth:`discard`."""

    def open_block(self, key: str) -> tuple[BinaryIO, str] | None:
        """``(the block file, open for reading; its xxh3 checksum)`` of a stored block, or None
        when absent. The caller closes the file; an eviction meanwhile only unlinks it.

        A read-only index lookup, cheap enough for an event loop; the access is recorded for LRU
        by the next :meth:`flush_accesses`.
        """
        if self._peek is None:  # the directory could not be opened: nothing stored
            return None
        handle, tag = self._peek.get(key, read=True, tag=True)
        if handle is None:
            return None
        self._note_access(key)
        return handle, tag

    def discard(self, key: str) -> None:
        """Drop one block (handed off to its owner); no error when it is already gone."""
        if self._cache is None:
            return
        with self._exclusive():
            self._cache.delete(key)


def worker_dir(level_dir: str, worker_id: str) -> str:
    """Cache directory of ``worker_id`` under a runtime's level directory."""
    return os.path.join(level_dir, worker_id)
