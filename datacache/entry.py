"""FileEntry: one file of a dataset's namespace at one version, as a UFS listing reports it and
the manifest stores it; SkippedLink: a symbolic link a listing left out; Unproven: bytes read of a
file that cannot be proven to be one version."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FileEntry:
    """``path``: dataset path (relative, '/'-separated); ``mount``: mount name; ``ufs_path``: path
    inside the mount's fsspec filesystem; ``size``: bytes; ``mtime``: seconds since the epoch;
    ``version``: ETag / generation / ``mtime:size:inode:ctime`` (see ``ufs.versions``)."""

    path: str
    mount: str
    ufs_path: str
    size: int
    mtime: float
    version: str


@dataclass(frozen=True)
class SkippedLink:
    """A symbolic link of a POSIX source that a listing left out (links are not followed):
    ``path``: its dataset path; ``mount``: mount name; ``ufs_path``: the link's own path."""

    path: str
    mount: str
    ufs_path: str


class Unproven(bytes):
    """Bytes of one UFS read that cannot be proven to belong to one version (a local file open for
    writing by another process while it was read, see ``ufs.versions``): right to return to the
    reader, as a direct read would, never to be cached."""
