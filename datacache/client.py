"""DatasetClient: read access to one dataset through its cache, the object FUSE and fsspec use.

It ties the layers together for one dataset: the manifest (namespace and versions), the block
source (cache + UFS) and read-ahead settings. It knows nothing of FUSE, HTTP or the CLI.
"""

from __future__ import annotations

import errno
import threading

from datacache.cache.blocks import block_count
from datacache.errors import StaleFileError
from datacache.manifest import FileEntry, Manifest, normalize
from datacache.reader import DatasetFile


class DatasetClient:
    """One dataset's namespace and data.

    ``name``: dataset name; ``manifest``: current snapshot; ``source``: block source (see
    ``cache.source``); ``ufs``: its ``UnionNamespace`` (for
    per-file refresh); ``save_manifest``: callable persisting a refreshed manifest;
    ``readahead``: blocks read ahead on sequential reads; ``load_manifest``: callable returning
    the stored manifest (for :meth:`reload` after a metadata sync by another process).
    """

    def __init__(self, name: str, manifest: Manifest, source, ufs, save_manifest=None, readahead: int = 4,
                 load_manifest=None):
        self.name = name
        self._manifest = manifest
        self.source = source
        self.ufs = ufs
        self._save = save_manifest
        self._load = load_manifest
        self.readahead = readahead
        self._lock = threading.Lock()

    @property
    def manifest(self) -> Manifest:
        return self._manifest

    @property
    def block_size(self) -> int:
        return self.source.block_size

    def stat(self, path: str) -> FileEntry | None:
        """The file at ``path``, or None for a directory. Raises FileNotFoundError (case C8)."""
        m = self._manifest
        try:
            entry = m.lookup(path)
            if entry is not None:
                return entry
            if m.is_dir(path):
                return None
        except ValueError as err:  # '..' or NUL: nothing outside the namespace exists
            raise FileNotFoundError(errno.ENOENT, str(err), path) from None
        raise FileNotFoundError(errno.ENOENT, "no such file or directory in dataset " + repr(self.name), path)

    def listdir(self, path: str = "") -> dict[str, FileEntry | None]:
        """Children of a directory: name -> FileEntry, or None for a subdirectory. Raises
        FileNotFoundError (also for paths with '..'), NotADirectoryError."""
        try:
            return self._manifest.listdir(path)
        except ValueError as err:
            raise FileNotFoundError(errno.ENOENT, str(err), path) from None

    def open(self, path: str) -> DatasetFile:
        """Open a file for reading, pinned to its current version. Raises FileNotFoundError,
        IsADirectoryError."""
        entry = self.stat(path)
        if entry is None:
            raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        return _RefreshingFile(entry, self)

    def cached_fraction(self, entry: FileEntry) -> float:
        """Fraction (0..1) of the file's current-version blocks held in the cache."""
        n = block_count(entry.size, self.block_size)
        if n == 0:
            return 1.0
        return sum(self.source.is_cached(entry, i) for i in range(n)) / n

    def cached_bytes(self, entries=None) -> int:
        """Bytes of current-version blocks held in the cache, over ``entries`` (default: all)."""
        bs = self.block_size
        total = 0
        for e in self._manifest if entries is None else entries:
            for i in range(block_count(e.size, bs)):
                if self.source.is_cached(e, i):
                    total += min(bs, e.size - i * bs)
        return total

    def usage(self) -> tuple[int, int]:
        """``(used, capacity)`` bytes of the cache's largest level."""
        return self.source.usage()

    def reload(self) -> bool:
        """Take the stored manifest if it changed (e.g. after ``datacache sync``); returns True when
        it did. Files already open stay on the versions they opened."""
        if self._load is None:
            return False
        fresh = self._load()
        with self._lock:
            if fresh is None or fresh.table.equals(self._manifest.table):
                return False
            self._manifest = fresh
            return True

    def refresh_file(self, path: str) -> FileEntry | None:
        """Re-read one file's metadata from the UFS into the manifest (None: it is gone)."""
        old = self._manifest.lookup(path)
        if old is None:
            return None
        try:
            fresh = self.ufs.stat(old.mount, old.ufs_path)
            entry = FileEntry(old.path, old.mount, old.ufs_path, fresh.size, fresh.mtime, fresh.version)
        except FileNotFoundError:
            entry = None
        with self._lock:
            # Apply the change to the newest stored snapshot, not to ours: a sync by another
            # process may have written a newer one, which saving ours would revert.
            base = (self._load() if self._load is not None else None) or self._manifest
            self._manifest = base.with_entry(entry, old.path)
            if self._save is not None:
                self._save(self._manifest)
        return entry

    def close(self) -> None:
        self.source.close()


class _RefreshingFile(DatasetFile):
    """A DatasetFile that, on a stale version, refreshes the file's manifest entry before raising,
    so that the next open reads the new version (case C5)."""

    def __init__(self, entry: FileEntry, client: DatasetClient):
        super().__init__(entry, client.source, client.readahead)
        self._client = client

    def pread(self, offset: int, size: int) -> bytes:
        try:
            return super().pread(offset, size)
        except StaleFileError:
            self._client.refresh_file(normalize(self.entry.path))
            raise
