"""DatasetClient: read access to one dataset through its cache, the object FUSE and fsspec use.

It ties the layers together for one dataset: the manifest (namespace and versions), the block
source (cache + UFS) and read-ahead settings. It knows nothing of FUSE, HTTP or the CLI.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from datacache.cache.blocks import block_count, block_slice
from datacache.cache.filetier import FileTier, materialize_entry
from datacache.errors import StaleFileError
from datacache.manifest import FileEntry, Manifest, normalize
from datacache.reader import DatasetFile

log = logging.getLogger(__name__)
AHEAD_THREADS = 8  # threads loading the next block of sequential readers, per client


class DatasetClient:
    """One dataset's namespace and data.

    ``name``: dataset name; ``manifest``: current snapshot; ``source``: block source (see
    ``cache.source``); ``ufs``: its ``UnionNamespace`` (for per-file refresh); ``save_manifest``:
    callable ``(manifest, path)`` persisting a manifest refreshed for dataset ``path``; ``readahead``: blocks read ahead on sequential reads;
    ``load_manifest``: callable returning the stored manifest (for :meth:`reload` after a metadata
    sync by another process); ``manifest_path``: the stored manifest's file, whose
    ``(inode, mtime_ns, size)`` tells cheaply whether a sync replaced it; ``reload_interval``:
    seconds between two such checks by :meth:`stat`, :meth:`listdir` and :meth:`open` (None: they
    never check; the FUSE daemon, which does not call them, runs :meth:`maybe_reload` on a timer). With
    ``readahead`` > 0, open files load their next block in a pool of ``AHEAD_THREADS`` threads
    (see :mod:`datacache.reader`). ``manifest_lock``: callable returning a context manager that
    excludes other processes' manifest writes (a sync's replace) while a refresh loads, edits and
    saves the stored manifest. ``files``: a callable opening this node's file tier (complete
    versions as contiguous files, :meth:`local_file`; None when it is off), called on first use so
    a client that never opens a file (a warmup) creates no file tier; or None.
    """

    def __init__(self, name: str, manifest: Manifest, source, ufs, save_manifest=None, readahead: int = 4,
                 load_manifest=None, manifest_path: str | None = None, reload_interval: float | None = 1.0,
                 manifest_lock=contextlib.nullcontext, files: Callable[[], FileTier | None] | None = None):
        self.name = name
        self._manifest = manifest
        self.generation = 0  # counts changes of the current manifest
        self.source = source
        self.ufs = ufs
        self._save = save_manifest
        self._load = load_manifest
        self.readahead = readahead
        self._lock = threading.Lock()
        self._manifest_lock = manifest_lock
        self._path = manifest_path
        self._stamp = _stamp(manifest_path)
        self.reload_interval = reload_interval
        self._checked = time.monotonic()
        self._listeners: list = []
        self._ahead_pool = None
        self._open_files = files
        self._files: FileTier | None = None
        self._copying: set[str] = set()  # file ids being copied into the file tier
        self._copy_pool = None

    @property
    def manifest(self) -> Manifest:
        """The current snapshot. Read :attr:`generation` first, then this: a snapshot is then at
        least as new as the generation read."""
        return self._manifest

    def on_change(self, listener) -> None:
        """Call ``listener(old, new)`` (two Manifests) after each change of the current manifest
        (:meth:`reload`, :meth:`refresh_file`), on the thread that made it."""
        self._listeners.append(listener)

    def _changed(self, old: Manifest, new: Manifest) -> None:
        for listener in self._listeners:
            listener(old, new)

    @property
    def block_size(self) -> int:
        return self.source.block_size

    def stat(self, path: str) -> FileEntry | None:
        """The file at ``path``, or None for a directory. Raises FileNotFoundError (case C8)."""
        self._auto_reload()
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
        self._auto_reload()
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
        return self.open_entry(entry)

    def open_entry(self, entry: FileEntry) -> DatasetFile:
        """Open the version ``entry`` names (e.g. the one a FUSE inode stands for); its reads raise
        ``StaleFileError`` once that version can no longer be read from the cache or the UFS."""
        if self.readahead > 0 and self._ahead_pool is None:
            with self._lock:
                if self._ahead_pool is None:
                    self._ahead_pool = ThreadPoolExecutor(AHEAD_THREADS, thread_name_prefix="datacache-ahead")
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
        """A read-only file descriptor of ``entry``'s version (of more than one block) as one
        complete local file, which the caller owns and closes; None when there is none. With the
        in-process block source, the disk level's own cache file of the version once all its blocks
        are stored (no copy: :meth:`LocalBlockSource.local_file`). With the runtime's workers (the
        blocks spread over them), the file tier's copy: a version complete in the cache but not
        in the file tier is copied there in the background (one copy at a time), so a later open
        finds it. Reads of that file reach no block source: they count no cache hits."""
        if entry.size <= self.block_size:
            return None
        whole = getattr(self.source, "local_file", None)
        if whole is not None:
            return whole(entry)
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
        self.refresh_file(normalize(entry.path))

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
        """``(used, capacity)`` bytes of the cache level blocks are written to (its first disk level)."""
        return self.source.usage()

    def reload(self) -> bool:
        """Take the stored manifest if it changed (e.g. after ``datacache sync``); returns True when
        it did. Files already open stay on the versions they opened."""
        if self._load is None:
            return False
        stamp = _stamp(self._path)
        fresh = self._load()
        with self._lock:
            self._stamp = stamp
            if fresh is None or fresh.equals(self._manifest):
                return False
            old, self._manifest = self._manifest, fresh
            self.generation += 1
        self._changed(old, fresh)
        return True

    def maybe_reload(self) -> bool:
        """:meth:`reload` when the stored manifest's file was replaced since the last load (one
        ``stat``: cheap); returns True when the current manifest changed."""
        self._checked = time.monotonic()
        if self._path is None or _stamp(self._path) == self._stamp:
            return False
        return self.reload()

    def _auto_reload(self) -> None:
        if self.reload_interval is not None and time.monotonic() - self._checked >= self.reload_interval:
            self.maybe_reload()

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
        with self._lock, self._manifest_lock():
            # Apply the change to the newest stored snapshot, not to ours: a sync by another
            # process may have written a newer one, which saving ours would revert (the lock keeps
            # a sync from replacing it between our load and our save).
            base = (self._load() if self._load is not None else None) or self._manifest
            new = base.with_entry(entry, old.path)
            previous, self._manifest = self._manifest, new
            self.generation += 1
            if self._save is not None:
                self._save(new, old.path)
        self._changed(previous, new)
        return entry

    def close(self) -> None:
        for pool in (self._ahead_pool, self._copy_pool):
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)  # before the store closes
        if self._files is not None:
            self._files.close()
        self.source.close()


def _stamp(path: str | None) -> tuple | None:
    """``(inode, mtime_ns, size)`` of ``path`` (None when absent): a save replaces the file
    (temp file + rename), so a new inode tells a new manifest."""
    try:
        st = os.stat(path) if path else None
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size) if st else None


class _RefreshingFile(DatasetFile):
    """A DatasetFile that, on a stale version, refreshes the file's manifest entry before raising,
    so that the next open reads the new version (case C5)."""

    def __init__(self, entry: FileEntry, client: DatasetClient):
        super().__init__(entry, client.source, client.readahead, client._ahead_pool)
        self._client = client

    def view(self, offset: int, size: int):
        try:
            return super().view(offset, size)
        except StaleFileError:
            self._client._stale(self.entry)
            raise
