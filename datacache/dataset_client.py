"""DatasetClient: read access to one dataset's data through its cache, the object FUSE and fsspec use.

The data half of a dataset's read access: it opens and reads files of the dataset's namespace
(:class:`~datacache.dataset_namespace.DatasetNamespace`, which it calls, never the reverse)
through the block source (cache + UFS), with read-ahead and the file tier. It knows nothing of
FUSE, HTTP or the CLI.
"""

from __future__ import annotations

import errno
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from datacache.cache.blocks import block_count, block_slice
from datacache.cache.filetier import FileTier, materialize_entry
from datacache.dataset_namespace import DatasetNamespace
from datacache.errors import StaleFileError
from datacache.manifest import FileEntry, Manifest, normalize
from datacache.reader import DatasetFile

log = logging.getLogger(__name__)


class DatasetClient:
    """One dataset's data, read through its cache.

    ``namespace``: the dataset's :class:`DatasetNamespace` (files and versions; a stale read
    refreshes the file's entry there); ``source``: block source (see
    :class:`~datacache.cache.blocksource.BlockSource`); ``readahead``: blocks read ahead on
    sequential reads; with ``readahead`` > 0, open files also load their next blocks through the
    source's read-ahead (see :mod:`datacache.reader`). ``files``: a callable opening this
    node's file tier (complete versions as contiguous files, :meth:`local_file`; None when it is
    off), called on first use so a client that never opens a file (a warmup) creates no file tier;
    or None.
    """

    def __init__(self, namespace: DatasetNamespace, source, readahead: int = 4,
                 files: Callable[[], FileTier | None] | None = None):
        self.namespace = namespace
        self.name = namespace.name
        self.source = source
        self.readahead = readahead
        self._lock = threading.Lock()
        self._readers: list[Callable[[FileEntry], None]] = []
        self._open_files = files
        self._files: FileTier | None = None
        self._copying: set[str] = set()  # file ids being copied into the file tier
        self._copy_pool = None

    @property
    def manifest(self) -> Manifest:
        """The namespace's current snapshot (see :attr:`DatasetNamespace.manifest`)."""
        return self.namespace.manifest

    @property
    def ufs(self):
        """The dataset's ``UnionNamespace`` (the namespace's)."""
        return self.namespace.ufs

    def stat(self, path: str) -> FileEntry | None:
        """:meth:`DatasetNamespace.stat`: the file at ``path``, None for a directory; raises
        FileNotFoundError."""
        return self.namespace.stat(path)

    def listdir(self, path: str = "") -> dict[str, FileEntry | None]:
        """:meth:`DatasetNamespace.listdir`."""
        return self.namespace.listdir(path)

    def on_read(self, listener: Callable[[FileEntry], None]) -> None:
        """Call ``listener(entry)`` when a file version is opened or read without opening
        (:meth:`open_entry`, :meth:`local_file`, :meth:`read`), on the reader's thread: the plan
        follower and the trace recorder (:mod:`datacache.plan`). It must be quick; a version may
        be reported more than once."""
        self._readers.append(listener)

    def reading(self, entry: FileEntry) -> None:
        """Tell the :meth:`on_read` listeners that ``entry`` is read (done by the methods named
        there; a FUSE daemon whose kernel opens files without it calls this on a read at offset 0)."""
        for listener in self._readers:
            listener(entry)

    @property
    def block_size(self) -> int:
        return self.source.block_size

    def open(self, path: str) -> DatasetFile:
        """Open a file for reading, pinned to its current version. Raises FileNotFoundError,
        IsADirectoryError."""
        entry = self.stat(path)
        if entry is None:
            raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        return self.open_entry(entry)

    def open_entry(self, entry: FileEntry) -> DatasetFile:
        """Open the version ``entry`` names (e.g. the one a FUSE inode stands for); its reads raise
        ``StaleFileError`` once that version can no longer be read from the cache or the UFS."""
        self.reading(entry)
        return _RefreshingFile(entry, self)

    @property
    def files(self) -> FileTier | None:
        """This node's file tier (opened on first use), or None."""
        if self._files is None and self._open_files is not None:
            with self._lock:
                if self._files is None and self._open_files is not None:
                    self._files, self._open_files = self._open_files(), None
        return self._files

    def local_file(self, entry: FileEntry) -> int | None:
        """A read-only file descriptor of ``entry``'s version as one complete local file, which
        the caller owns and closes; None when there is none. With the in-process block source,
        the disk level's own cache file of the version once all its blocks are stored (no copy:
        :meth:`LocalBlockSource.local_file`), whatever its size. With the runtime's workers (the
        blocks spread over them), the file tier's copy of a version of more than one block: one
        complete in the cache but not in the file tier is copied there in the background (one
        copy at a time), so a later open finds it. Reads of that file reach no block source: they
        count no cache hits beyond the one-block version's (see the source's). Does not tell the
        read listeners (:meth:`open_entry` does; a caller using only this calls :meth:`reading`)."""
        whole = getattr(self.source, "local_file", None)
        if whole is not None:
            return whole(entry)
        if entry.size <= self.block_size:
            return None
        if self.files is None:
            return None
        fid = self.source.key(entry, 0).file_id
        fd = self.files.open(fid)
        if fd is None:
            with self._lock:
                if fid in self._copying:
                    return None
                self._copying.add(fid)
                if self._copy_pool is None:
                    self._copy_pool = ThreadPoolExecutor(1, thread_name_prefix="datacache-filetier")
            self._copy_pool.submit(self._copy_to_file_tier, fid, entry)
        return fd

    def _copy_to_file_tier(self, fid: str, entry: FileEntry) -> None:
        try:
            materialize_entry(self.files, self.source, entry)
        except (OSError, ValueError) as err:  # a tier too small, a full disk, the UFS: reads go on through blocks
            log.info("%s: not kept in the file tier: %s", entry.path, err)
        finally:
            with self._lock:
                self._copying.discard(fid)

    def read(self, entry: FileEntry, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``offset`` of the version ``entry`` names, without a file left
        open (fsspec's ``cat_file``): short only at EOF, ``b""`` at or past it. A range inside one
        block is one block read (a whole small file comes back as the block itself, no copy);
        a longer one goes through a :class:`DatasetFile`, for its read-ahead. Raises as
        :meth:`open_entry`'s reads do."""
        self.reading(entry)
        end = min(offset + size, entry.size)
        if offset >= end:
            return b""
        bs = self.source.block_size
        index = offset // bs
        if (end - 1) // bs != index:
            with self.open_entry(entry) as f:
                return f.pread(offset, size)
        try:
            block = self.source.get(entry, index, pieces=True)
        except StaleFileError:
            self._stale(entry)
            raise
        lo, hi = offset - index * bs, end - index * bs
        if lo == 0 and hi == len(block) and isinstance(block, bytes):
            return block
        return bytes(block_slice(block, lo, hi))

    def _stale(self, entry: FileEntry) -> None:
        """``entry``'s version can no longer be read: refresh its manifest entry, so that the next
        open reads the new version (case C5)."""
        self.namespace.refresh_file(normalize(entry.path))

    def cached_fraction(self, entry: FileEntry) -> float:
        """Fraction (0..1) of the file's current-version blocks held in the cache."""
        n = block_count(entry.size, self.block_size)
        if n == 0:
            return 1.0
        return sum(self.source.is_cached(entry, i) for i in range(n)) / n

    def cached_file_bytes(self, entry: FileEntry) -> int:
        """Bytes of ``entry``'s current-version blocks held in the cache (``entry.size`` when
        complete: one presence check per block)."""
        bs = self.block_size
        return sum(min(bs, entry.size - i * bs) for i in range(block_count(entry.size, bs))
                   if self.source.is_cached(entry, i))

    def cached_bytes(self, entries=None) -> int:
        """Bytes of current-version blocks held in the cache, over ``entries`` (default: all)."""
        return sum(self.cached_file_bytes(e) for e in (self.namespace.manifest if entries is None else entries))

    def usage(self) -> tuple[int, int]:
        """``(used, capacity)`` bytes of the cache level blocks are written to (its first disk level)."""
        return self.source.usage()

    def close(self) -> None:
        for listener in self._readers:  # a plan's prefetch stops before the store closes
            if hasattr(listener, "close"):
                listener.close()
        if self._copy_pool is not None:
            self._copy_pool.shutdown(wait=True, cancel_futures=True)  # before the store closes
        if self._files is not None:
            self._files.close()
        self.source.close()


class _RefreshingFile(DatasetFile):
    """A DatasetFile that, on a stale version, refreshes the file's manifest entry before raising,
    so that the next open reads the new version (case C5)."""

    def __init__(self, entry: FileEntry, client: DatasetClient):
        super().__init__(entry, client.source, client.readahead)
        self._client = client

    def view(self, offset: int, size: int):
        try:
            return super().view(offset, size)
        except StaleFileError:
            self._client._stale(self.entry)
            raise
