"""DatasetNamespace: one dataset's file tree and versions, from its manifest.

The namespace half of a dataset's read access: which files exist, at which version, and how the
manifest follows a sync by another process or a per-file refresh. It reads no data; the data half,
:class:`~datacache.dataset_client.DatasetClient`, calls it and never the reverse. Listing a
dataset (``datacache ls``) needs only this, so it works without a runtime.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time

from datacache.manifest import FileEntry, Manifest


class DatasetNamespace:
    """The file tree of dataset ``name``.

    ``manifest``: current snapshot; ``ufs``: the dataset's ``UnionNamespace`` (for
    :meth:`refresh_file`; None: no refresh); ``save_manifest``: callable ``(manifest, path)``
    persisting a manifest refreshed for dataset ``path``; ``load_manifest``: callable returning the
    stored manifest (for :meth:`reload` after a sync by another process); ``manifest_path``: the
    stored manifest's file, whose ``(inode, mtime_ns, size)`` tells cheaply whether a sync replaced
    it; ``reload_interval``: seconds between two such checks by :meth:`stat` and :meth:`listdir`
    (None: they never check; the FUSE daemon runs :meth:`maybe_reload` on a timer);
    ``manifest_lock``: callable returning a context manager that excludes other processes'
    manifest writes (a sync's replace) while a refresh loads, edits and saves the stored manifest.
    """

    def __init__(self, name: str, manifest: Manifest, ufs=None, save_manifest=None, load_manifest=None,
                 manifest_path: str | None = None, reload_interval: float | None = 1.0,
                 manifest_lock=contextlib.nullcontext):
        self.name = name
        self._manifest = manifest
        self.generation = 0  # counts changes of the current manifest
        self.ufs = ufs
        self._save = save_manifest
        self._load = load_manifest
        self._lock = threading.Lock()
        self._manifest_lock = manifest_lock
        self._path = manifest_path
        self._stamp = _stamp(manifest_path)
        self.reload_interval = reload_interval
        self._checked = time.monotonic()
        self._listeners: list = []

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
        """Re-read one file's metadata from the UFS into the manifest (None: it is gone, or this
        namespace has no UFS to ask)."""
        old = self._manifest.lookup(path)
        if old is None or self.ufs is None:
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


def _stamp(path: str | None) -> tuple | None:
    """``(inode, mtime_ns, size)`` of ``path`` (None when absent): a save replaces the file
    (temp file + rename), so a new inode tells a new manifest."""
    try:
        st = os.stat(path) if path else None
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size) if st else None
