"""FUSE mounts of a dataset, as the kernel lists them (``fsname=datacache:NS/NAME``)."""

from __future__ import annotations

import os

from datacache import mountinfo
from datacache.stack import layout


def fuse_mounts_of(namespace: str, name: str, home: str | None = None) -> list[str]:
    """Mount points where dataset ``namespace``/``name`` is mounted (from /proc/self/mountinfo);
    with ``home``, only those served by a daemon of that ``$DATACACHE_HOME`` (its state file is
    there): another home's dataset of the same name is another dataset."""
    source = f"datacache:{namespace}/{name}"
    return [m.mountpoint for m in mountinfo.mounts() if m.is_fuse and m.source == source
            and (home is None or os.path.exists(layout.fuse_state_path(home, m.mountpoint)))]


def lazy_unmount(path: str) -> None:
    """Detach the mount at ``path`` now (open files keep reading until closed). Raises
    ``OSError`` (``UnmountError``) when it stays mounted."""
    mountinfo.lazy_unmount(path)
