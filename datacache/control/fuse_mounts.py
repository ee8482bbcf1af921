"""FUSE mounts of a dataset, as the kernel lists them (``fsname=datacache:NS/NAME``)."""

from __future__ import annotations

from datacache import mountinfo


def fuse_mounts_of(namespace: str, name: str) -> list[str]:
    """Mount points where dataset ``namespace``/``name`` is mounted (from /proc/self/mountinfo)."""
    source = f"datacache:{namespace}/{name}"
    return [m.mountpoint for m in mountinfo.mounts() if m.is_fuse and m.source == source]


def lazy_unmount(path: str) -> None:
    """Detach the mount at ``path`` now (open files keep reading until closed). Raises
    ``OSError`` (``UnmountError``) when it stays mounted."""
    mountinfo.lazy_unmount(path)
