"""Read-ahead across files: a reader that goes through a directory's files in name order gets
the next ones prepared before it asks.

The Reader reads ahead inside a file (sequential blocks); nothing did across files, so a scan of a
tree of small files (an unshuffled epoch, a validation pass, ``tar``, ``rsync``) waited for the
device once per file, after a FUSE round trip: through a mount with the page cache dropped, 0.45x
the local disk's rate for 100 KB files, where the local file system's own read of the file is the
same one device read. :class:`FileReadAhead` is an ``on_read`` listener of a
:class:`~datacache.dataset_client.DatasetClient`: when the file read is the next in its
directory (name order, as ``ls`` and ``sorted(os.listdir())`` give it) after the last one read
there, or a few places on (several DataLoader workers share one scan), for ``CONFIRM`` reads in a
row, the first block of each of the following ``ahead`` files is prefetched through the block
source: a cached block is read ahead by the kernel (``posix_fadvise(WILLNEED)`` on its cache
file), a missing one is filled from the UFS if the memory budget allows
(:meth:`~datacache.cache.blocksource.BlockSource.prefetch`). A shuffled order costs nothing but
the check: a step that happens to land a few places on is common in small directories (15 files
a class: about one read in four), three in a row are rare (a shuffled epoch of 300 such files
read 1.18x its bytes from the UFS when one step started a prefetch, 1.12x with two, 1.01x with
three, and filled the cache with files it did not need). While a published plan
(:mod:`datacache.plan`) is followed, it prefetches by the known order and this one stands by.
Prefetching is best effort: a failure to start one (a source closing) never fails the read.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from datacache.manifest import FileEntry

log = logging.getLogger(__name__)

AHEAD_FILES = 8  # files prepared ahead of a sequential scan
STRIDE = 4  # a read this many places past the last one still counts as the scan going on
CONFIRM = 3  # steps of a scan in a row before the next files are prepared
DIRECTORIES = 1024  # directories whose last read is kept (a scan is in a few at a time)


class FileReadAhead:
    """``on_read`` listener of ``client`` (a DatasetClient: its namespace's manifest gives the
    order, its current block source prefetches). ``standby``: True while something better
    prefetches (a plan is followed); ``ahead``: files prepared ahead; ``stride``: see
    :data:`STRIDE`; ``confirm``: see :data:`CONFIRM`.

    Places are the manifest's rows in path order (:meth:`Manifest.position`), in which a
    directory's files follow each other in name order: a read costs a cached look-up, whatever
    the directory's size (a listing per read cost 2.3 ms a shuffled read in 1,000 directories of
    1,281 files, ImageNet's shape). A subdirectory's files sort among its parent's, so a scan
    steps over a subdirectory as over a jump. The window moves on once less than half of it is
    left ahead of the reads, several files at a time, as the kernel's read-ahead does; a read well
    behind the window starts over (the next epoch's scan). Thread-safe."""

    def __init__(self, client, standby: Callable[[], bool] = lambda: False, ahead: int = AHEAD_FILES,
                 stride: int = STRIDE, confirm: int = CONFIRM):
        self.client = client
        self.namespace = client.namespace
        self.standby = standby
        self.ahead = ahead
        self.stride = stride
        self.confirm = confirm
        self.prefetched = 0  # files whose first block was asked for
        self._lock = threading.Lock()
        self._manifest = None  # the snapshot the places below are rows of
        # dir -> (row of the last file read there, scan steps in a row that led to it, row past
        # the last file prepared), the DIRECTORIES most recently read in
        self._scans: dict[str, tuple[int, int, int]] = {}  # in order of the last read in each

    def __call__(self, entry: FileEntry) -> None:
        if self.standby():
            return
        manifest = self.namespace.manifest
        row = manifest.position(entry.path)
        if row is None:  # not in the current snapshot (gone since): not a scan step
            return
        parent = entry.path.rpartition("/")[0]  # posixpath.dirname of a canonical path, in a third of the time
        with self._lock:
            if manifest is not self._manifest:
                self._manifest = manifest
                self._scans.clear()
            last, steps, high = self._scans.pop(parent, (None, 0, 0))  # put back last: most recent
            steps = steps + 1 if last is not None and 0 < row - last <= self.stride else 0
            if row < high - 2 * self.ahead:  # well behind what was prepared: a new scan (the next epoch's)
                high = 0
            start, end = max(row + 1, high), min(row + 1 + self.ahead, manifest.file_num)
            # not a scan (yet), or more than half of the window still ahead: nothing to prepare now
            prepare = steps >= self.confirm and high - row <= self.ahead // 2 and start < end
            if prepare:
                high = end
            self._scans[parent] = (row, steps, high)
            if len(self._scans) > DIRECTORIES:
                del self._scans[next(iter(self._scans))]  # the least recently read in
        if not prepare:
            return
        upcoming = [f for f in manifest.rows(start, end) if f.path.rpartition("/")[0] == parent]
        source = self.client.source
        try:
            for f in upcoming:
                source.prefetch(f, 0)
        except (OSError, RuntimeError) as err:  # RuntimeError: its pools are shut down (closing)
            log.debug("read-ahead of %s's next files not started: %s", entry.path, err)
            return
        self.prefetched += len(upcoming)
