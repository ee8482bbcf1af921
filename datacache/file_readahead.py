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
import posixpath
import threading
from collections import OrderedDict
from collections.abc import Callable

from datacache.manifest import FileEntry

log = logging.getLogger(__name__)

AHEAD_FILES = 8  # files prepared ahead of a sequential scan
STRIDE = 4  # a read this many places past the last one still counts as the scan going on
CONFIRM = 3  # steps of a scan in a row before the next files are prepared
DIRECTORIES = 64  # directory listings kept (a scan is in a few at a time)


class FileReadAhead:
    """``on_read`` listener of ``client`` (a DatasetClient: its namespace gives directory order,
    its current block source prefetches). ``standby``: True while something better prefetches
    (a plan is followed); ``ahead``: files prepared ahead; ``stride``: see :data:`STRIDE`;
    ``confirm``: see :data:`CONFIRM`.
    Thread-safe; quick (a dict lookup per read, one prefetch call per file the scan moves on)."""

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
        # dir -> (its files in name order, path -> position), the DIRECTORIES most recently read in
        self._order: OrderedDict[str, tuple[list[FileEntry], dict[str, int]]] = OrderedDict()
        self._manifest = None  # the snapshot _order was built from
        self._last: dict[str, int] = {}  # dir -> position of the last file read there
        self._steps: dict[str, int] = {}  # dir -> scan steps in a row that led to that file
        self._high: dict[str, int] = {}  # dir -> position past the last file prepared

    def __call__(self, entry: FileEntry) -> None:
        if self.standby():
            return
        parent = posixpath.dirname(entry.path)
        with self._lock:
            files, position = self._directory(parent)
            i = position.get(entry.path)
            if i is None:  # not in the current listing (gone since): not a scan step
                return
            last = self._last.get(parent)
            self._last[parent] = i
            steps = self._steps[parent] = self._steps.get(parent, 0) + 1 if (
                last is not None and 0 < i - last <= self.stride) else 0
            if steps < self.confirm:
                return
            start = max(i + 1, self._high.get(parent, 0))
            end = min(i + 1 + self.ahead, len(files))
            self._high[parent] = max(end, self._high.get(parent, 0))
            upcoming = files[start:end]
        source = self.client.source
        try:
            for f in upcoming:
                source.prefetch(f, 0)
        except (OSError, RuntimeError) as err:  # RuntimeError: its pools are shut down (closing)
            log.debug("read-ahead of %s's next files not started: %s", entry.path, err)
            return
        self.prefetched += len(upcoming)

    def _directory(self, parent: str) -> tuple[list[FileEntry], dict[str, int]]:
        """The files of ``parent`` in name order and their positions (under the lock; rebuilt
        when the manifest changed)."""
        manifest = self.namespace.manifest
        if manifest is not self._manifest:
            self._manifest = manifest
            self._order.clear()
            self._last.clear()
            self._steps.clear()
            self._high.clear()
        known = self._order.get(parent)
        if known is not None:
            self._order.move_to_end(parent)
            return known
        try:
            children = self.namespace.listdir(parent)
        except OSError:
            children = {}
        files = [e for _, e in sorted(children.items()) if e is not None]
        known = self._order[parent] = (files, {e.path: n for n, e in enumerate(files)})
        if len(self._order) > DIRECTORIES:
            gone, _ = self._order.popitem(last=False)
            self._last.pop(gone, None)
            self._steps.pop(gone, None)
            self._high.pop(gone, None)
        return known

