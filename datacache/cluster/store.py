"""A worker's disk tier, able to hand out a block's file and checksum for zero-copy serving.

The worker serves disk blocks with ``sendfile`` (aiohttp ``FileResponse``), so the bytes never pass
through Python and the worker cannot verify them on the way out. It sends the checksum stored with
the block instead (``X-Block-Checksum``) and the client verifies it: integrity is still checked on
every read, end to end, at the one place that has the bytes anyway.
"""

from __future__ import annotations

import os

from datacache.cache.disk import DiskTier


class ServingDiskTier(DiskTier):
    """DiskTier plus :meth:`open_block`."""

    def open_block(self, key: str) -> tuple[str, str] | None:
        """``(path of the block file, xxh3 checksum)`` of a stored block, or None when absent.

        Counts as an access for LRU. The file may still be evicted right after; callers that
        open it later must handle ``FileNotFoundError``.
        """
        handle, tag = self._cache.get(key, read=True, tag=True)
        if handle is None:
            return None
        handle.close()
        return handle.name, tag


def worker_dir(level_dir: str, worker_id: str) -> str:
    """Cache directory of ``worker_id`` under a runtime's level directory."""
    return os.path.join(level_dir, worker_id)
