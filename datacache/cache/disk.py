"""SSD/HDD tier: block files under one cache directory, indexed by diskcache.

Layout and safety:
- diskcache keeps the index (key, size, access time, checksum as its ``tag``) in SQLite and each
  block in its own file; directories are created 0700 and block files 0600, so a second local user
  cannot read cached data (case C10).
- The quota counts what is on disk under the directory (block files, the SQLite database and its
  WAL). A put takes an exclusive lock (a thread lock plus ``flock`` for other processes sharing the
  directory), evicts least recently used blocks from the high to the low watermark when the new
  block would pass the high mark, then writes. So the quota holds while many fills run at once
  (cases C1, C2), across processes, with at most the block being written in flight.
- Every block is verified against its xxh3 checksum when read; a corrupt block is dropped and
  reported as a miss, so the caller refetches it and never returns wrong bytes.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import threading

import diskcache

from datacache import private
from datacache.cache.blocks import checksum



class _PrivateDisk(diskcache.Disk):
    """diskcache storage that creates directories 0700 and files 0600."""

    def _write(self, full_path, iterator, mode, encoding=None):
        directory = os.path.dirname(full_path)
        if not os.path.isdir(directory):
            private.makedirs(directory)
        fd = os.open(full_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, private.FILE_MODE)
        with open(fd, mode.replace("x", "w"), encoding=encoding) as writer:
            if isinstance(iterator, io.BytesIO):  # one write: iterating a BytesIO yields "lines"
                return writer.write(iterator.getbuffer())
            size = 0
            for chunk in iterator:
                size += len(chunk)
                writer.write(chunk)
            return size


class DiskTier:
    """Block files under ``path`` bounded by ``quota`` bytes with ``high``/``low`` watermarks.

    ``medium`` is "SSD" or "HDD" (only reported). Raises ``OSError`` if the directory cannot be
    created. Counters: ``hits``, ``misses``, ``evictions``, ``corrupt`` (this process only).
    """

    def __init__(self, path: str, quota: int, high: float = 0.95, low: float = 0.7, medium: str = "SSD"):
        self.path = os.path.abspath(path)
        self.medium = medium
        self.quota = quota
        self._high = int(quota * high)
        self._low = int(quota * low)
        private.makedirs(self.path)
        self._lock = threading.Lock()
        self._lock_fd = os.open(private.touch(os.path.join(self.path, ".lock")), os.O_RDWR)
        self._cache = diskcache.Cache(
            self.path,
            disk=_PrivateDisk,
            eviction_policy="least-recently-used",
            size_limit=2**62,  # culling is ours (watermarks), never diskcache's own
            cull_limit=0,
            disk_min_file_size=0,
            # Keep the write-ahead log small: it counts against the quota too.
            sqlite_wal_autocheckpoint=256,
            sqlite_journal_size_limit=1 << 20,
        )
        # A second handle whose reads do not update access times, for lookups that are not uses
        # of the block (read-ahead hints, short-circuit paths): only get() counts as a use.
        self._peek = diskcache.Cache(self.path, disk=_PrivateDisk)
        self._peek.reset("eviction_policy", "least-recently-stored", update=False)
        for name in ("cache.db", "cache.db-wal", "cache.db-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.chmod(os.path.join(self.path, name), private.FILE_MODE)
        self.evictions = 0
        self.corrupt = 0

    @contextlib.contextmanager
    def _exclusive(self):
        with self._lock:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def used(self) -> int:
        """Bytes on disk under the directory: blocks, index database and its write-ahead log."""
        wal = os.path.join(self.path, "cache.db-wal")
        try:
            wal_size = os.path.getsize(wal)
        except FileNotFoundError:
            wal_size = 0
        return self._cache.volume() + wal_size

    def __contains__(self, key: str) -> bool:
        return key in self._cache

    def get(self, key: str) -> memoryview | None:
        """The block's bytes (a memoryview over one buffer: callers slice out what they need
        without another copy), or None when absent or corrupt (a corrupt or truncated block is
        deleted). Marks the block recently used."""
        handle, tag = self._cache.get(key, read=True, tag=True)
        if handle is None:
            return None
        with handle:
            buf = bytearray(os.fstat(handle.fileno()).st_size)
            data = memoryview(buf)[:handle.readinto(buf)]
        if checksum(data) != tag:
            self.corrupt += 1
            self._cache.delete(key)
            return None
        return data

    def block_file(self, key: str) -> str | None:
        """Path of the block's file (for short-circuit reads and sendfile), or None."""
        handle = self._peek.get(key, read=True)
        if handle is None:
            return None
        handle.close()
        return handle.name

    def advise(self, key: str) -> bool:
        """True when the block is stored; its file is then read ahead asynchronously by the kernel
        (``posix_fadvise(WILLNEED)``), so the coming ``get`` finds it in the page cache."""
        path = self.block_file(key)
        if path is None:
            return False
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:  # evicted meanwhile: a miss after all
            return False
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)
        return True

    def put(self, key: str, data: bytes | memoryview) -> bool:
        """Store a block; False when it cannot fit under the high watermark even in an empty tier."""
        size = len(data)
        if size > self._high:
            return False
        with self._exclusive():
            if key in self._cache:
                return True
            if self.used() + size > self._high:
                self._evict_to(self._low - size)
            self._cache.set(key, bytes(data), tag=checksum(data))
        return True

    def _evict_to(self, target: int) -> None:
        before = len(self._cache)
        overhead = self.used() - self._cache.volume()  # the WAL, which diskcache does not count
        self._cache.reset("size_limit", max(target - overhead, 0))
        try:
            self._cache.cull()
        finally:
            self._cache.reset("size_limit", 2**62)
        self.evictions += before - len(self._cache)

    def delete_prefix(self, prefix: str) -> int:
        """Delete every block whose key starts with ``prefix``; returns how many."""
        doomed = [k for k in self._cache.iterkeys() if isinstance(k, str) and k.startswith(prefix)]
        for k in doomed:
            self._cache.delete(k)
        return len(doomed)

    def keys(self):
        """Iterate over stored block keys."""
        return (k for k in self._cache.iterkeys() if isinstance(k, str))

    def close(self) -> None:
        self._peek.close()
        self._cache.close()
        os.close(self._lock_fd)
