"""Inode numbers for the paths of one mounted dataset.

Scheme, and why:

- A dataset's namespace is the manifest's directory index (directories are implied by file
  paths, as in object stores). The kernel names things by inode, the manifest by path, so the
  daemon needs a path <-> inode table and nothing else: attributes are *not* stored here. Every
  ``getattr``/``open`` looks the path up in the client's current manifest, so a per-file refresh
  (case C5: a shrunk or overwritten object) shows its new size and version at once.
- Numbers are handed out lazily, the first time the kernel is told about a path (``lookup`` or
  ``readdir``), counting up from ``pyfuse3.ROOT_INODE`` (the dataset root, path ``""``). A
  dataset of 1,000,000 files costs nothing until it is listed, and a 100,000-entry directory
  costs one list entry and one dict entry per name (case C12).
- Numbers are never reused or freed while the daemon lives: a path keeps its inode for the mount's
  lifetime, so tools that compare ``(st_dev, st_ino)`` (tar, rsync, ``os.walk(followlinks)``,
  ``find -inum``) see a consistent tree, and ``forget`` needs no bookkeeping. The table only grows
  with the paths actually visited, bounded by the manifest's size.

All methods run on the event-loop thread; the table holds no lock.
"""

from __future__ import annotations

import posixpath

import pyfuse3

ROOT = pyfuse3.ROOT_INODE


class InodeTable:
    """Maps dataset paths (normalised, ``""`` = root) to inode numbers and back."""

    def __init__(self) -> None:
        self._paths: list[str | None] = [None] * ROOT + [""]  # index = inode number
        self._inodes: dict[str, int] = {"": ROOT}

    def __len__(self) -> int:
        return len(self._inodes)

    def path(self, inode: int) -> str:
        """The dataset path of ``inode``. Raises ``FileNotFoundError`` for an unknown number."""
        if 0 <= inode < len(self._paths):
            path = self._paths[inode]
            if path is not None:
                return path
        raise FileNotFoundError(f"unknown inode {inode}")

    def inode(self, path: str) -> int:
        """The inode number of dataset ``path`` (normalised), assigning the next free one."""
        ino = self._inodes.get(path)
        if ino is None:
            ino = len(self._paths)
            self._paths.append(path)
            self._inodes[path] = ino
        return ino

    @staticmethod
    def child(parent: str, name: str) -> str:
        """The dataset path of entry ``name`` in directory ``parent``; ``.`` and ``..`` resolve
        (``..`` of the root is the root, as in POSIX). Raises ``FileNotFoundError`` for a name
        that cannot be a dataset path component (contains ``/`` or NUL)."""
        if name == ".":
            return parent
        if name == "..":
            return posixpath.dirname(parent)
        if not name or "/" in name or "\0" in name:
            raise FileNotFoundError(f"invalid name {name!r}")
        return f"{parent}/{name}" if parent else name
