"""Inode numbers for the paths of one mounted dataset: one inode per (path, file version).

Scheme, and why:

- A dataset's namespace is the manifest's directory index (directories are implied by file
  paths, as in object stores). The kernel names things by inode, the manifest by path, so the
  daemon keeps inode -> (path, FileEntry) for what the kernel was told about, nothing more.
- **A file's version is part of its identity.** The kernel keeps a file's pages per inode. If a
  file kept its inode across versions, a handle still open on the old version would refill those
  pages with old bytes that a new open of the new version then reads (a mix of both versions).
  With one inode per version, the pages of an inode only ever hold bytes of its version; so
  ``keep_cache`` is always safe, and an inode's attributes are those of its version, for as long
  as anyone holds it. After a change the daemon invalidates the old directory entry, and the next
  lookup of the path answers the new inode (see ``ops.py``).
- **Numbers derive from the name:** a 64-bit hash (xxh3) of the path, plus the version for files,
  so a path keeps its number for as long as its version is unchanged, also after the kernel
  forgot it and across remounts; tools that compare ``(st_dev, st_ino)`` (tar, rsync, ``find
  -inum``) see a consistent tree. A collision (odds about 5e-8 over a million live inodes: the
  birthday bound n^2 / 2^64) takes the next free number.
- **Bounded by what the kernel holds:** an inode enters the table when a ``lookup`` or
  ``readdir`` reply names it and leaves when the kernel's ``forget`` brings its lookup count back
  to zero. A dataset of 1,000,000 files costs nothing until it is listed, and afterwards only as
  much as the kernel keeps in its inode cache (case C12).

All methods run on the event-loop thread; the table holds no lock.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Iterator

import xxhash

ROOT = 1  # FUSE_ROOT_ID: the mount's root
_FIRST = ROOT + 1  # numbers below are reserved (0: none, 1: root)
_SPAN = (1 << 63) - _FIRST  # stay below 2**63: some tools hold st_ino in a signed 64-bit integer


@dataclass(slots=True)
class Node:
    """What one inode stands for: ``path`` (dataset path, ``""`` = root), ``entry`` (the
    ``FileEntry`` of the file's version, None for a directory), ``lookups`` (the kernel's
    lookup count) and ``checked`` (the client's manifest generation at which ``entry`` was last
    known to be current)."""

    path: str
    entry: object
    lookups: int = 0
    checked: int = -1

    def same(self, path: str, entry) -> bool:
        if self.path != path:
            return False
        if self.entry is None or entry is None:
            return self.entry is None and entry is None
        return self.entry.version == entry.version


class InodeTable:
    """inode number -> :class:`Node`, for the inodes the kernel holds."""

    def __init__(self) -> None:
        self._nodes: dict[int, Node] = {ROOT: Node("", None, 1)}

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, inode: int) -> bool:
        return inode in self._nodes

    def __iter__(self) -> Iterator[tuple[int, Node]]:
        return iter(list(self._nodes.items()))

    def node(self, inode: int) -> Node:
        """The node of ``inode``. Raises ``FileNotFoundError`` for a number the kernel was not
        given (or has forgotten)."""
        node = self._nodes.get(inode)
        if node is None:
            raise FileNotFoundError(f"unknown inode {inode}")
        return node

    def number(self, path: str, entry) -> int:
        """The inode number of ``path`` at ``entry``'s version (None: a directory), without
        registering it. Deterministic, except after a hash collision."""
        if not path:
            return ROOT
        key = path if entry is None else f"{path}\0{entry.version}"
        ino = _FIRST + xxhash.xxh3_64_intdigest(key.encode("utf-8", "surrogateescape")) % _SPAN
        while (node := self._nodes.get(ino)) is not None and not node.same(path, entry):
            ino = _FIRST + (ino - _FIRST + 1) % _SPAN
        return ino

    def remember(self, inode: int, path: str, entry, generation: int) -> None:
        """Count one more kernel reference to ``inode`` (a number from :meth:`number` for the same
        ``path`` and ``entry``, current in the manifest of ``generation``): a lookup reply, or a
        readdir entry the kernel took."""
        node = self._nodes.get(inode)
        if node is None:
            self._nodes[inode] = node = Node(path, entry)
        node.lookups += 1
        node.checked = max(node.checked, generation)

    def lookup(self, path: str, entry, generation: int) -> int:
        """:meth:`number` then :meth:`remember`: the inode to answer a lookup with."""
        inode = self.number(path, entry)
        self.remember(inode, path, entry, generation)
        return inode

    def forget(self, inode: int, count: int) -> None:
        """The kernel dropped ``count`` references; the node goes when none is left (never the
        root)."""
        node = self._nodes.get(inode)
        if node is None or inode == ROOT:
            return
        node.lookups -= count
        if node.lookups <= 0:
            del self._nodes[inode]

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
