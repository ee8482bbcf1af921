"""What a dataset mount shows besides file bytes (the handlers in ``kernel_ops``).

- xattrs: ``user.datacache.cached`` (cached fraction of the file's blocks, ``"0.75"``),
  ``user.datacache.version`` (the pinned version), ``user.datacache.ufs_path`` (``mount:path``);
- ``statfs`` block size and ``st_blksize``;
- ``st_nlink`` of directories (:class:`SubdirCounts`).
"""

import threading

XATTR_CACHED = b"user.datacache.cached"
XATTR_VERSION = b"user.datacache.version"
XATTR_UFS_PATH = b"user.datacache.ufs_path"
FILE_XATTRS = (XATTR_CACHED, XATTR_VERSION, XATTR_UFS_PATH)

STATFS_BLOCK = 4096  # f_frsize/f_bsize, bytes
ST_BLKSIZE = 128 * 1024  # preferred I/O size (Python's open() buffers this much)


class SubdirCounts:
    """``st_nlink`` of a directory is 2 + its subdirectories: counted once per directory and
    manifest (a new manifest starts afresh). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._of = None  # the manifest the counts are for
        self._counts: dict[str, int] = {}

    def nlink(self, manifest, path: str) -> int:
        """2 + the number of subdirectories of directory ``path`` in ``manifest`` (2 for a path
        that is not a directory there)."""
        with self._lock:
            if self._of is not manifest:
                self._counts, self._of = {}, manifest
            n = self._counts.get(path)
        if n is None:
            children = manifest.listdir(path).values() if manifest.is_dir(path) else ()
            n = sum(1 for child in children if child is None)
            with self._lock:
                if self._of is manifest:
                    self._counts[path] = n
        return 2 + n
