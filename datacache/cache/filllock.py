"""Per-block fill locks shared by every process using one cache directory.

Single-flight inside a process (a dict of futures, :mod:`datacache.cache.local_source`) does not reach
the DataLoader's worker processes: 32 processes reading one cold S3 object through
``datacache://`` made 291 GETs for its 12 blocks (issue 18). A fill of a block therefore runs
"check the cache -> read the UFS -> store" under an exclusive ``flock`` whose lock file is named
by the block key's hash; a process that waited re-checks the cache and reads the filled block.

Lock files are stripes: ``<cache dir>/fill-locks/<nnn>.lock``, ``STRIPES`` of them at most, made
on first use and never deleted (deleting a lock file races with a process about to lock it).
Two blocks on one stripe only wait for each other's fill. Locks are taken in stripe order, so
fills of several blocks at once (warmup spans) in several processes cannot deadlock. ``flock``
belongs to the open file, so threads of one process exclude each other too, and a process that
dies drops its locks with its files. Callers take the memory budget *before* these locks: a
process never waits for memory while it holds a lock other processes wait on.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import zlib
from typing import Iterable, Iterator

from datacache import private

STRIPES = 4096
LOCK_DIR = "fill-locks"


class FillLocks:
    """Fill locks under the cache directory ``directory`` (the disk tier's path)."""

    def __init__(self, directory: str):
        self.directory = os.path.join(directory, LOCK_DIR)

    def stripe(self, key: str) -> int:
        """The stripe of a block key (``str(BlockKey)``): CRC-32 of its UTF-8 bytes, the same in
        every process (Python's ``hash`` is salted per process)."""
        return zlib.crc32(key.encode("utf-8")) % STRIPES

    @contextlib.contextmanager
    def held(self, keys: Iterable[str]) -> Iterator[None]:
        """Hold the fill locks of ``keys`` (blocking until every other holder lets go). Raises
        ``OSError`` when the directory cannot be written (callers then fill unlocked)."""
        stripes = sorted({self.stripe(k) for k in keys})
        fds: list[int] = []
        try:
            for n in stripes:
                fd = self._open(n)
                fds.append(fd)
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            for fd in reversed(fds):
                os.close(fd)  # closing the last descriptor of the open file drops its lock

    def _open(self, n: int) -> int:
        path = os.path.join(self.directory, f"{n:03x}.lock")
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, private.FILE_MODE)
        except FileNotFoundError:  # first use (or the directory was removed): make it
            private.makedirs(self.directory)
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, private.FILE_MODE)
