"""A worker's disk tier, able to hand out a block's file and checksum for zero-copy serving.

The worker serves disk blocks with ``sendfile`` from the cache file :meth:`open_block` opened, at the
block's offset in its file version's file, so the bytes never pass through Python and the worker
cannot verify them on the way out. It sends the
checksum stored with the block instead (``X-Block-Checksum``) and the client verifies it: integrity
is still checked on every read, end to end, at the one place that has the bytes anyway.

A disk hit looks the block up without writing to the index (writing the access time on every read
would cost: an SQLite transaction on the event loop per block served); the worker
writes the access times of the blocks served in one transaction per ``ACCESS_FLUSH_S`` seconds.
"""

from __future__ import annotations

import os
from typing import BinaryIO

from datacache.cache.disk import ACCESS_FLUSH_S, DiskTier

__all__ = ["ACCESS_FLUSH_S", "ServingDiskTier", "worker_dir"]


class ServingDiskTier(DiskTier):
    """DiskTier plus :meth:`open_block` (:meth:`DiskTier.discard` drops a block handed off)."""

    def open_block(self, key: str) -> tuple[BinaryIO, int, int, str] | None:
        """``(the block's cache file, open for reading; the block's offset and size in bytes in
        it; its xxh3 checksum)`` of a stored block, or None when absent. The caller closes the
        file. An eviction meanwhile unlinks the file (a file handed out whole) or punches a hole
        where the block was (zeros, which the client's checksum rejects: it then asks again).

        A read-only index lookup, cheap enough for an event loop; the access is recorded for LRU
        by the next :meth:`flush_accesses`.
        """
        extent = self.block_extent(key)
        if extent is None:
            return None
        path, offset, size, digest = extent
        try:
            f = open(path, "rb", buffering=0)  # noqa: SIM115 - the caller closes it
        except FileNotFoundError:  # evicted since the lookup
            self._rows.pop(key, None)
            return None
        self._note_access(key)
        return f, offset, size, digest


def worker_dir(level_dir: str, worker_id: str) -> str:
    """Cache directory of ``worker_id`` under a runtime's level directory."""
    return os.path.join(level_dir, worker_id)
