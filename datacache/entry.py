"""FileEntry: one file of a dataset's namespace at one version, as a UFS listing reports it and
the manifest stores it."""

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
