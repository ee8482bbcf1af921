"""Kernel passthrough: backing ids for the files the kernel reads directly, and when not to use them.

A passthrough OPEN reply names a *backing id*, which ``ioctl(FUSE_DEV_IOC_BACKING_OPEN)`` returns
for an open file descriptor (Linux >= 6.9, ``CONFIG_FUSE_PASSTHROUGH``, ``CAP_SYS_ADMIN``). Rules
the kernel enforces, and how :class:`BackingFiles` keeps them (fs/fuse/iomode.c, passthrough.c,
backing.c; go-fuse's ``RegisterBackingFd`` notes the first one):

- A FUSE inode has at most one backing file while it has passthrough handles: another backing id
  for it fails the open (EBUSY, EIO to the caller). So there is one id per backing file
  (``st_dev, st_ino``), shared by every handle of it and closed when the last one is released.
- An inode cannot be open through the page cache and passed through at once: a passthrough
  open while cached handles are open fails (ETXTBSY, EIO to the caller), and a cached open while
  passthrough handles are open is refused too. So an inode with cached handles open is served
  through READ until they are closed, and one with passthrough handles open is passed through
  (its backing file holds the inode's bytes).
- Reopens: a backing id outlives its last handle, kept idle for its inode (at most ``IDLE_MAX``,
  least recently released closed first, and when the kernel forgets the inode), so the next open
  of that inode reuses it: no cache lookup, no ``open``, no BACKING_OPEN and BACKING_CLOSE per open
  (an open of a complete cached file cost ~450 us before, most of a Parquet row group read). A
  kept id pins its file's bytes; one whose file was unlinked since (the cache evicted it) is closed
  at the next open instead of reused, or by :meth:`BackingFiles.sweep` (every second, in the
  daemon's watcher) if that comes first: an idle daemon held 25-41 MiB of evicted files on a
  small cache device for 12 minutes when only an open closed them.
- Reopens without Python: after a passthrough OPEN the session may list the inode in the
  compiled loops' table (:mod:`.fast_open`, :meth:`BackingFiles.list_reopens`); its later
  read-only OPENs are answered in C with the same backing id. A listed inode holds one handle of
  its backing (the table's own), so the id is not kept idle or closed while listed; it is retired
  when the kernel forgets the inode, when its file is unlinked (:meth:`BackingFiles.sweep`), and
  for every inode when the operations ask (:meth:`BackingFiles.retire_reopens`: the dataset
  changed); the table's handle is released once the last handle opened in C is.
- Refusals: EPERM (no ``CAP_SYS_ADMIN``) stops passthrough for the session; ELOOP (the backing
  file is on a stacked file system such as overlayfs, deeper than ``max_stack_depth`` allows),
  EOPNOTSUPP/EINVAL (a file system without ``read_iter``, or passthrough not negotiated) fall back
  for that file. Each reason is logged once; the file is then served through READ.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from datacache_fuse.kernel import abi
from datacache_fuse.kernel.fast_open import FastOpens

log = logging.getLogger("datacache_fuse")

_U32 = struct.Struct("=I")
IDLE_MAX = 64  # backing ids kept after their last handle, for the next open of their inode

WHY = {
    errno.EPERM: "the daemon lacks CAP_SYS_ADMIN (passthrough needs it); serving reads through the daemon",
    errno.ELOOP: "the backing file is on a stacked file system (overlayfs?) deeper than max_stack_depth allows; "
                 "serving it through the daemon (max_stack_depth=2 would pass it through but forbids stacking "
                 "an overlay on this mount)",
    errno.EOPNOTSUPP: "the backing file's file system cannot be read by the kernel directly (no read_iter); "
                      "serving it through the daemon",
}


def backing_open(dev_fd: int, fd: int) -> int:
    """Register open file ``fd`` with the FUSE connection of ``dev_fd``: its backing id (> 0).
    Raises ``OSError`` (EPERM, ELOOP, EOPNOTSUPP, EINVAL)."""
    arg = bytearray(abi.BACKING_MAP.pack(fd, 0, 0))
    return fcntl.ioctl(dev_fd, abi.DEV_IOC_BACKING_OPEN, arg, True)


def backing_close(dev_fd: int, backing_id: int) -> None:
    """Drop backing id ``backing_id`` (handles opened with it keep their file)."""
    fcntl.ioctl(dev_fd, abi.DEV_IOC_BACKING_CLOSE, bytearray(_U32.pack(backing_id)), True)


@dataclass
class _Backing:
    backing_id: int
    fd: int  # our own descriptor of the backing file: tells whether it was unlinked since
    handles: int = 0
    idle_ino: int | None = None  # kept for this inode's next open (no handle open)


@dataclass
class _Inode:
    cached: int = 0  # handles open through the page cache (READ)
    key: tuple | None = None  # backing file of its passthrough handles
    passthrough: int = 0


@dataclass
class BackingFiles:
    """Backing ids of one FUSE connection (``dev_fd``), counted per handle. Thread-safe.

    ``enabled``: the kernel negotiated passthrough. :meth:`open_handle` / :meth:`release_handle`
    bracket every handle the session hands out."""

    dev_fd: int
    enabled: bool
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _by_key: dict = field(default_factory=dict)  # (st_dev, st_ino) -> _Backing
    _by_id: dict = field(default_factory=dict)  # backing id -> (st_dev, st_ino)
    _inodes: dict = field(default_factory=dict)  # FUSE inode -> _Inode
    _idle: OrderedDict = field(default_factory=OrderedDict)  # FUSE inode -> key of its idle backing
    _told: set = field(default_factory=set)  # errnos already logged
    refused: int = 0  # passthrough opens served through READ instead
    registered: int = 0  # BACKING_OPEN calls made
    fast: FastOpens | None = None  # the compiled loops' table of reopens, when they answer OPENs
    _listed: dict = field(default_factory=dict)  # FUSE inode -> backing id it is listed with in ``fast``
    _listing: int = 0  # bumped by retire_reopens: a listing begun before it is retired again

    def reusable(self, ino: int) -> bool:
        """True when an open of ``ino`` can be passed through without naming its file: it has
        passthrough handles open, or an idle backing id whose file is still linked (one that is
        not is closed now)."""
        with self._lock:
            node = self._inodes.get(ino)
            if node is not None and node.key is not None:
                return True
            key = self._idle.get(ino)
            if key is None:
                return False
            if os.fstat(self._by_key[key].fd).st_nlink > 0:
                return True
            self._drop_idle(ino)
            return False

    def sweep(self) -> int:
        """Retire the listed reopens of files unlinked since (evicted), then close the idle backing
        ids of such files (a retired one's too, once no handle is open): how many inodes it let
        go of."""
        with self._lock:
            unlinked = [ino for ino, backing_id in self._listed.items()
                        if os.fstat(self._by_key[self._by_id[backing_id]].fd).st_nlink == 0]
        for ino in unlinked:
            self.retire_reopen(ino)
        with self._lock:
            gone = [ino for ino, key in self._idle.items() if os.fstat(self._by_key[key].fd).st_nlink == 0]
            for ino in gone:
                self._drop_idle(ino)
        return len(set(unlinked) | set(gone))

    def forget(self, ino: int) -> None:
        """The kernel forgot inode ``ino``: retire its reopens and close its idle backing id, if any."""
        self.retire_reopen(ino)
        with self._lock:
            if ino in self._idle:
                self._drop_idle(ino)

    def list_reopens(self, ino: int, backing_id: int) -> bool:
        """After an OPEN of ``ino`` passed through with ``backing_id``: let the compiled loops
        answer its next read-only OPENs (see the module doc). False when they cannot (no table,
        every slot taken, listed already)."""
        with self._lock:
            if self.fast is None or ino in self._listed or len(self._listed) >= self.fast.table.size:
                return False
            self._listed[ino] = backing_id
            listing = self._listing
        pinned = self.open_handle(ino, None)  # the table's own handle: keeps the id registered
        if pinned == backing_id and self.fast.put(ino, backing_id):
            if listing != self._listing:  # retired while it was being listed
                self.retire_reopen(ino)
            return True
        with self._lock:
            del self._listed[ino]
        self.release_handle(ino, pinned)
        return False

    def released_reopen(self, ino: int) -> None:
        """A handle of ``ino`` opened by a compiled loop (fh ``FAST_FH``) was released."""
        if self.fast is not None and self.fast.release(ino) == 1:
            self._unlist(ino)

    def retire_reopen(self, ino: int) -> None:
        """Stop the compiled loops' opens of ``ino``; its table handle is released now or with the
        last handle they opened."""
        if self.fast is not None and ino in self._listed and self.fast.retire(ino) == 1:
            self._unlist(ino)

    def retire_reopens(self) -> None:
        """:meth:`retire_reopen` of every listed inode (e.g. the dataset's files changed: each
        OPEN must be checked by the operations again)."""
        with self._lock:
            self._listing += 1
            listed = list(self._listed)
        for ino in listed:
            self.retire_reopen(ino)

    def _unlist(self, ino: int) -> None:
        with self._lock:
            backing_id = self._listed.pop(ino, None)
        if backing_id is not None:
            self.release_handle(ino, backing_id)

    def open_handle(self, ino: int, backing: str | int | None) -> int | None:
        """A handle of FUSE inode ``ino`` is being opened; ``backing``: the local file to pass
        through, as a path or an open descriptor (closed here), or None to serve through READ.
        Returns the backing id to put in the OPEN reply, or None to serve this handle through READ
        (see the module's docstring for when)."""
        try:
            return self._open_handle(ino, backing)
        finally:
            if isinstance(backing, int):
                os.close(backing)

    def _open_handle(self, ino: int, path: str | int | None) -> int | None:
        with self._lock:
            node = self._inodes.setdefault(ino, _Inode())
            if node.key is not None:  # passthrough handles open: this one must join them
                self._by_key[node.key].handles += 1
                node.passthrough += 1
                return self._by_key[node.key].backing_id
            if ino in self._idle and not node.cached:  # reopened: its idle id serves it again
                key = self._idle.pop(ino)
                backing = self._by_key[key]
                backing.idle_ino = None
                backing.handles += 1
                node.key, node.passthrough = key, 1
                return backing.backing_id
            if path is None or not self.enabled or node.cached:
                node.cached += 1
                return None
            try:
                key, backing = self._register(path)
            except OSError as err:
                node.cached += 1
                self.refused += 1
                self._tell(err, path)
                return None
            backing.handles += 1
            node.key, node.passthrough = key, 1
            return backing.backing_id

    def release_handle(self, ino: int, backing_id: int | None) -> None:
        """The handle opened by :meth:`open_handle` (which returned ``backing_id``) is released."""
        with self._lock:
            node = self._inodes.get(ino)
            if node is None:
                return
            if backing_id is None:
                node.cached = max(node.cached - 1, 0)
            else:
                node.passthrough -= 1
                if node.passthrough <= 0:
                    node.key, node.passthrough = None, 0
                key = self._by_id.get(backing_id)
                backing = self._by_key.get(key)
                if backing is not None:
                    backing.handles -= 1
                    if backing.handles <= 0 and backing.idle_ino is None:
                        self._keep_idle(ino, key, backing)
            if not node.cached and not node.passthrough:
                del self._inodes[ino]

    def _keep_idle(self, ino: int, key: tuple, backing: _Backing) -> None:
        """Keep ``backing`` (no handle open) for the next open of ``ino``; the least recently kept
        one past ``IDLE_MAX`` is closed. Called holding the lock."""
        if ino in self._idle:  # another backing file kept for this inode (not reopened since)
            self._drop_idle(ino)
        backing.idle_ino = ino
        self._idle[ino] = key
        while len(self._idle) > IDLE_MAX:
            self._drop_idle(next(iter(self._idle)))

    def _drop_idle(self, ino: int) -> None:
        """Close the idle backing id kept for ``ino``. Called holding the lock."""
        key = self._idle.pop(ino)
        backing = self._by_key[key]
        backing.idle_ino = None
        if backing.handles <= 0:
            del self._by_key[key], self._by_id[backing.backing_id]
            self._close(backing)

    def close_all(self) -> None:
        """Drop every backing id (the session is ending)."""
        with self._lock:
            for backing in self._by_key.values():
                self._close(backing)
            self._by_id.clear()
            self._by_key.clear()
            self._inodes.clear()
            self._idle.clear()
            self._listed.clear()

    @property
    def open_ids(self) -> int:
        """Backing ids registered now (with handles open, or idle)."""
        return len(self._by_id)

    @property
    def held(self) -> int:
        """Backing ids with handles open."""
        return sum(b.handles > 0 for b in self._by_key.values())

    def _register(self, path: str | int) -> tuple[tuple, _Backing]:
        fd = path if isinstance(path, int) else os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            key = (st.st_dev, st.st_ino)
            backing = self._by_key.get(key)
            if backing is None:
                backing_id = backing_open(self.dev_fd, fd)  # the kernel keeps its own reference
                self.registered += 1
                backing = self._by_key[key] = _Backing(backing_id, os.dup(fd))
                self._by_id[backing_id] = key
            elif backing.idle_ino is not None:  # kept for another inode: in use again
                del self._idle[backing.idle_ino]
                backing.idle_ino = None
            return key, backing
        finally:
            if fd is not path:
                os.close(fd)

    def _close(self, backing: _Backing) -> None:
        os.close(backing.fd)
        try:
            backing_close(self.dev_fd, backing.backing_id)
        except OSError as err:  # the connection is gone: nothing to free
            log.debug("backing close of id %d: %s", backing.backing_id, err)

    def _tell(self, err: OSError, path: str | int) -> None:
        if err.errno == errno.EPERM:
            self.enabled = False
        if err.errno in self._told:
            return
        self._told.add(err.errno)
        why = WHY.get(err.errno, f"cannot pass it through ({err.strerror}); serving it through the daemon")
        log.warning("passthrough of %s: %s", f"descriptor {path}" if isinstance(path, int) else path, why)
