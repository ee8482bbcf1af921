"""A read-only view of a local directory through the transport: its reference file system.

Tests and benchmarks serve a directory tree with it; it shows how an :class:`.Operations`
implementation keeps lookup counts, directory snapshots and handles. An inode stands for one
file *version* (a path and the backing file's ``st_ino``): a file replaced in the tree gets a new
inode at its next lookup, as a datacache file version does.

``passthrough``: OPEN names the backing file, so the kernel reads it directly; ``no_open``: OPEN
answers ENOSYS (the kernel then opens without asking, READs carry ``fh`` 0); ``readdirplus``:
answer READDIRPLUS; ``reopen`` (with ``passthrough``): let the session's compiled loops answer
later opens of a file passed through (``OpenOut.reopen``). ``calls`` counts calls of ``open``,
``read``, ``lookup``, ``getattr`` and ``reopened``.
"""

from __future__ import annotations

import collections
import errno
import os
import stat
import threading
from dataclasses import dataclass

from datacache_fuse.kernel.abi import ROOT_ID
from datacache_fuse.kernel.operations import (AddEntry, AddEntryPlus, Attr, DirEntry, EntryOut, OpenOut, Operations,
                                              Request, StatFs, attr_of_stat)


@dataclass
class _Node:
    rel: str  # path under the root, "" for the root
    key: tuple  # (rel, st_ino)
    nlookup: int = 0


class MirrorOperations(Operations):
    """Serve directory ``root`` read-only (see the module's docstring). ``timeout``: entry and
    attribute timeout in seconds."""

    def __init__(self, root: str, *, passthrough: bool = False, no_open: bool = False, readdirplus: bool = False,
                 timeout: float = 60.0, reopen: bool = False):
        self.root = os.path.realpath(root)
        self.passthrough, self.no_open, self.timeout = passthrough, no_open, timeout
        self.reopen = reopen and passthrough
        self.readdirplus_enabled = readdirplus
        self.calls: collections.Counter = collections.Counter()
        self._lock = threading.Lock()
        st = os.lstat(self.root)
        self._nodes: dict[int, _Node] = {ROOT_ID: _Node("", ("", st.st_ino), 1)}
        self._by_key: dict[tuple, int] = {("", st.st_ino): ROOT_ID}
        self._next_ino = ROOT_ID + 1
        self._dirs: dict[int, list] = {}
        self._next_dir = 1
        self._fds: dict[int, int] = {}  # no-open mode: ino -> fd
        self.session = None  # set by init: told when the kernel forgets an inode

    def _count(self, what: str) -> None:
        with self._lock:
            self.calls[what] += 1

    def _path(self, ino: int) -> tuple[_Node, str]:
        node = self._nodes.get(ino)
        if node is None:
            raise OSError(errno.ESTALE, "unknown inode")
        return node, os.path.join(self.root, node.rel)

    def ino_of(self, rel: str) -> int | None:
        """The inode the kernel was given for path ``rel`` (its current version), or None."""
        try:
            st = os.lstat(os.path.join(self.root, rel))
        except FileNotFoundError:
            return None
        return self._by_key.get((rel.strip("/"), st.st_ino))

    def _entry(self, rel: str, st) -> EntryOut:
        """An entry for ``rel`` counted as one lookup."""
        key = (rel, st.st_ino)
        with self._lock:
            ino = self._by_key.get(key)
            if ino is None:
                ino = self._next_ino
                self._next_ino += 1
                self._by_key[key] = ino
                self._nodes[ino] = _Node(rel, key)
            self._nodes[ino].nlookup += 1
        return EntryOut(ino, attr_of_stat(st, ino), entry_timeout=self.timeout, attr_timeout=self.timeout)

    # -- names -----------------------------------------------------------------------------------
    def lookup(self, parent: int, name: bytes, req: Request) -> EntryOut:
        self._count("lookup")
        node, _ = self._path(parent)
        rel = os.path.join(node.rel, os.fsdecode(name)) if node.rel else os.fsdecode(name)
        return self._entry(rel, os.lstat(os.path.join(self.root, rel)))

    def forget(self, ino: int, nlookup: int) -> None:
        with self._lock:
            node = self._nodes.get(ino)
            if node is None or ino == ROOT_ID:
                return
            node.nlookup -= nlookup
            if node.nlookup > 0:
                return
            del self._nodes[ino], self._by_key[node.key]
            fd = self._fds.pop(ino, None)
            if fd is not None:
                os.close(fd)
        if self.session is not None:
            self.session.backing.forget(ino)  # its idle backing id, its reopens

    def init(self, session) -> None:
        self.session = session

    def getattr(self, ino: int, fh: int | None, req: Request) -> tuple[Attr, float]:
        self._count("getattr")
        _, path = self._path(ino)
        return attr_of_stat(os.lstat(path), ino), self.timeout

    def statfs(self, ino: int, req: Request) -> StatFs:
        s = os.statvfs(self.root)
        return StatFs(s.f_blocks, s.f_bfree, s.f_bavail, s.f_files, s.f_ffree, s.f_bsize, s.f_namemax, s.f_frsize)

    # -- files -----------------------------------------------------------------------------------
    def open(self, ino: int, flags: int, req: Request) -> OpenOut:
        self._count("open")
        if self.no_open:
            raise OSError(errno.ENOSYS, "no-open mode")
        _, path = self._path(ino)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        return OpenOut(fh=fd, keep_cache=True, passthrough=path if self.passthrough else None, reopen=self.reopen)

    def read(self, ino: int, fh: int, offset: int, size: int) -> bytes:
        self._count("read")
        if fh == 0:  # no-open mode
            fd = self._fds.get(ino)
            if fd is None:
                _, path = self._path(ino)
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                with self._lock:
                    old = self._fds.setdefault(ino, fd)
                if old != fd:
                    os.close(fd)
                    fd = old
            fh = fd
        return os.pread(fh, size, offset)

    def release(self, ino: int, fh: int) -> None:
        if fh:
            os.close(fh)

    def reopened(self, ino: int) -> None:
        self._count("reopened")

    # -- directories -----------------------------------------------------------------------------
    def opendir(self, ino: int, flags: int, req: Request) -> OpenOut:
        node, path = self._path(ino)
        names = sorted(os.listdir(path))  # a snapshot: offsets index it
        with self._lock:
            fh = self._next_dir
            self._next_dir += 1
            self._dirs[fh] = (node.rel, names)
        return OpenOut(fh=fh)

    def _snapshot(self, fh: int):
        snap = self._dirs.get(fh)
        if snap is None:
            raise OSError(errno.EBADF, "unknown directory handle")
        return snap

    def readdir(self, ino: int, fh: int, offset: int, add: AddEntry) -> None:
        rel, names = self._snapshot(fh)
        for i in range(offset, len(names)):
            try:
                st = os.lstat(os.path.join(self.root, rel, names[i]))
            except FileNotFoundError:
                continue
            if not add(DirEntry(os.fsencode(names[i]), st.st_ino, st.st_mode, i + 1)):
                return

    def readdirplus(self, ino: int, fh: int, offset: int, add: AddEntryPlus) -> None:
        rel, names = self._snapshot(fh)
        for i in range(offset, len(names)):
            child = os.path.join(rel, names[i]) if rel else names[i]
            try:
                st = os.lstat(os.path.join(self.root, child))
            except FileNotFoundError:
                continue
            entry = self._entry(child, st)
            if not add(os.fsencode(names[i]), entry, i + 1):
                self.forget(entry.ino, 1)  # not sent: the kernel holds no lookup of it
                return

    def releasedir(self, ino: int, fh: int) -> None:
        with self._lock:
            self._dirs.pop(fh, None)

    # -- xattrs ----------------------------------------------------------------------------------
    def getxattr(self, ino: int, name: bytes, req: Request) -> bytes:
        _, path = self._path(ino)
        return os.getxattr(path, name, follow_symlinks=False)

    def listxattr(self, ino: int, req: Request) -> list[bytes]:
        _, path = self._path(ino)
        return [os.fsencode(n) for n in os.listxattr(path, follow_symlinks=False)]

    def destroy(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()


def is_dir(attr: Attr) -> bool:
    return stat.S_ISDIR(attr.mode)
