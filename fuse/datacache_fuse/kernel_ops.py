"""The dataset's FUSE handlers: kernel requests translated into DatasetClient calls, nothing more.

They run on the FUSE transport of :mod:`datacache_fuse.kernel`. A handler is a lookup in the
manifest (``lookup``, ``getattr``, ``readdir``: cheap dict operations) or a call into the Reader
(``read``, xattrs, ``statfs``: they touch the disk cache or the network). The layer knows nothing
of workers, the UFS or the cache policy.

Rules, and why:

- **Read-only.** Every request that would change the tree or a file answers EROFS (the session
  does, :mod:`datacache_fuse.kernel.session`); the mount is also made ``ro``, so the kernel
  refuses most of them first.
- **Caching by the kernel.** Entries and attributes carry ``entry_timeout``/``attr_timeout``
  (the runtime's ``fuse.attrTimeout``, seconds): repeated ``stat``/``lookup`` do not reach the
  daemon. An inode stands for one version of a file (see :mod:`.inodes`), so its pages never mix
  versions and ``open`` always sets ``keep_cache``: a later epoch is served from the kernel's page
  cache.
- **Changes reach the kernel.** When the current manifest changes (a per-file refresh, case C5, or
  a ``datacache sync`` by another process, noticed within ``reload_interval`` seconds by a watcher
  thread), every directory entry the kernel may hold that the new manifest contradicts is
  invalidated (:mod:`.changes`): paths deleted or at a new version, and names that were missing
  (negative entries) but now exist (cases C3, C4). The diff and the invalidations run on a thread
  of their own, never in a handler (the kernel may hold a directory lock for it). ``open`` of an
  inode whose version is no longer current answers ESTALE, which makes the kernel look the path up
  again and open the new inode; handles already open keep reading their version (or get ESTALE
  once it is gone).
- **No OPEN, no RELEASE (no-open mode, the default).** The first ``open`` answers ENOSYS: the
  kernel then opens files without asking the daemon and keeps their page cache (fs/fuse/file.c,
  "Default for no-open": ``FOPEN_KEEP_CACHE``), so a warm epoch over small files costs the daemon
  nothing. Reads carry the inode and file handle 0; an inode stands for one version, so the
  version pin of case C3 holds. A read that answers ESTALE first invalidates the file's directory
  entry, so the caller's next ``open`` looks the path up again.
- **Handles and passthrough (``--read-mode passthrough``).** Each ``open`` gets a handle and ``release``
  drops it. An OPEN of a version held whole as one local file (``DatasetClient.local_file``: the
  disk tier's cache file of a version whose blocks are all stored, or with workers the file
  tier's copy) names that file, and the kernel reads it directly: no READ reaches the daemon for
  that handle. Other versions are served through READ (their reads fill the cache, so a later
  open passes through).
- **One Reader per handle.** A handle (per ``open``, or per inode in no-open mode, at most
  ``INODE_READERS`` kept, least recently read idle ones dropped first; :mod:`.handles`) has its own
  ``DatasetFile`` whose sequential detection drives read-ahead. Handlers run on the session's
  worker threads, several at once: the inode and handle tables are guarded by one lock (held for
  dict work only, never for I/O), and reads of one handle are serialised by the handle's lock (a
  DatasetFile keeps a current block and is not thread-safe). Read-ahead memory is one budget for
  the whole daemon (the block source's ``readahead.budget``), not per handle. A read is answered with
  a view of the block, not a copy.
- **Directory listings** answer READDIRPLUS: each entry the kernel took counts as a lookup.
- **Errors** (:mod:`datacache_fuse.kernel.errnos`): ENOENT for missing paths, ESTALE for an inode
  whose version is no longer current, EIO only for real read failures. A read that failed is not
  retried against the UFS for ``RETRY_WINDOW`` seconds when the kernel asks again for the same
  range (it retries a failed read-ahead page by page), so an outage costs the reader one round of
  the UFS client's retries, not two.
- **Cache state where users look** (:mod:`.shown`). ``getfattr -n user.datacache.cached FILE`` is
  the cached fraction of the file's blocks (``"0.75"``); ``user.datacache.version`` is the pinned
  version; ``statfs`` (``df``) reports the cache: size = capacity, used = bytes cached.
"""

from __future__ import annotations

import errno
import logging
import os
import posixpath
import stat
import threading
import time
from collections import OrderedDict

from datacache_fuse.changes import stale_names
from datacache_fuse.inodes import InodeTable
from datacache_fuse.kernel.errnos import errno_of
from datacache_fuse.kernel.operations import (AddEntry, AddEntryPlus, Attr, DirEntry, EntryOut, OpenOut, Operations,
                                              Request, StatFs)
from datacache_fuse.handles import INODE_READERS, Handle
from datacache_fuse.shown import (FILE_XATTRS, ST_BLKSIZE, STATFS_BLOCK, XATTR_CACHED, XATTR_UFS_PATH, XATTR_VERSION,
                                  SubdirCounts)

log = logging.getLogger("datacache_fuse")


class DatasetOperations(Operations):
    """FUSE handlers over one ``datacache.dataset_client.DatasetClient``.

    ``attr_timeout``: seconds the kernel may cache entries and attributes; ``reload_interval``:
    seconds between two checks for a new stored manifest (None: never); ``no_open``: answer the
    first OPEN with ENOSYS (the kernel's no-open mode; default), else a handle per open;
    ``passthrough``: with handles, pass complete cached files through (see the module's docstring).
    """

    readdirplus_enabled = True

    def __init__(self, client, *, attr_timeout: float = 60.0, reload_interval: float | None = 1.0,
                 no_open: bool = True, passthrough: bool = False):
        self.client = client
        self.passthrough = passthrough and not no_open
        self.attr_timeout = float(attr_timeout)
        self.no_open = no_open
        self.inodes = InodeTable()
        self.session = None
        self._lock = threading.Lock()
        self._uid, self._gid = os.getuid(), os.getgid()
        self._mount_ns = time.time_ns()
        self._files: dict[int, Handle] = {}  # fh -> handle
        self._readers: OrderedDict[int, Handle] = OrderedDict()  # no-open mode: inode -> handle
        self._dirs: dict[int, tuple] = {}  # fh -> (dir path, [(name, FileEntry | None)], generation)
        self._next_fh = 1
        self._subdirs = SubdirCounts()
        self._reload_interval = reload_interval
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        client.namespace.on_change(self._on_change)

    # -- lifecycle -------------------------------------------------------------------------------
    def init(self, session) -> None:
        self.session = session
        if self._reload_interval is not None:
            self._watcher = threading.Thread(target=self._watch_manifest, name="datacache-fuse-watch", daemon=True)
            self._watcher.start()

    def _watch_manifest(self) -> None:
        """Every ``reload_interval`` seconds: pick up a ``datacache sync`` made by another process
        (the client calls :meth:`_on_change` when the stored manifest is new), and let go of idle
        backing files the cache evicted (:meth:`BackingFiles.sweep`)."""
        while not self._stop.wait(self._reload_interval):
            try:
                self.client.namespace.maybe_reload()
            except Exception as err:  # noqa: BLE001 - a half-written manifest: keep the current one
                log.warning("could not reload the manifest: %s", err)
            if self.session is not None:
                self.session.backing.sweep()

    def destroy(self) -> None:
        """Stop the watcher and close every handle (the session ended)."""
        self._stop.set()
        with self._lock:
            handles = [*self._files.values(), *self._readers.values()]
            self._files.clear()
            self._readers.clear()
            self._dirs.clear()
        for handle in handles:
            handle.file.close()

    @property
    def open_files(self) -> int:
        return len(self._files)

    def _new_fh(self) -> int:
        with self._lock:
            fh = self._next_fh
            self._next_fh += 1
            return fh

    def _node(self, ino: int):
        with self._lock:
            return self.inodes.node(ino)

    # -- metadata --------------------------------------------------------------------------------
    def _attr(self, ino: int, path: str, entry) -> Attr:
        if entry is None:
            nlink = self._subdirs.nlink(self.client.manifest, path)
            return Attr(ino, stat.S_IFDIR | 0o555, 0, nlink, self._uid, self._gid, 0, ST_BLKSIZE,
                        self._mount_ns, self._mount_ns, self._mount_ns)
        ns = int(entry.mtime * 1e9)
        return Attr(ino, stat.S_IFREG | 0o444, entry.size, 1, self._uid, self._gid, None, ST_BLKSIZE, ns, ns, ns)

    def _entry(self, ino: int, path: str, entry) -> EntryOut:
        return EntryOut(ino, self._attr(ino, path, entry), entry_timeout=self.attr_timeout,
                        attr_timeout=self.attr_timeout)

    def lookup(self, parent: int, name: bytes, req: Request) -> EntryOut:
        path = InodeTable.child(self._node(parent).path, os.fsdecode(name))
        generation = self.client.namespace.generation  # before the manifest: see DatasetClient.manifest
        manifest = self.client.manifest
        entry = manifest.lookup(path)
        if entry is None and not manifest.is_dir(path):
            # A negative entry cached for attr_timeout: a name that appears later is invalidated
            # by the manifest diff (stale_names).
            return EntryOut(0, entry_timeout=self.attr_timeout)
        with self._lock:
            ino = self.inodes.lookup(path, entry, generation)
        return self._entry(ino, path, entry)

    def getattr(self, ino: int, fh: int | None, req: Request) -> tuple[Attr, float]:
        node = self._node(ino)  # the attributes of the inode's own version
        return self._attr(ino, node.path, node.entry), self.attr_timeout

    def forget(self, ino: int, nlookup: int) -> None:
        with self._lock:
            self.inodes.forget(ino, nlookup)
            if ino in self.inodes:
                return
            handle = self._readers.get(ino)
            if handle is not None and not handle.lock.locked():
                del self._readers[ino]
            else:
                handle = None
        if self.session is not None:
            self.session.backing.forget(ino)  # its idle backing id, if any
        if handle is not None:
            handle.file.close()

    def access(self, ino: int, mask: int, req: Request) -> None:
        self._node(ino)
        if mask & os.W_OK:
            raise OSError(errno.EACCES, "read-only dataset")

    def statfs(self, ino: int, req: Request) -> StatFs:
        used, capacity = self.client.usage()
        free = max(capacity - used, 0) // STATFS_BLOCK
        return StatFs(capacity // STATFS_BLOCK, free, free, self.client.manifest.file_num, 0, STATFS_BLOCK, 255,
                      STATFS_BLOCK)

    # -- directories -----------------------------------------------------------------------------
    def opendir(self, ino: int, flags: int, req: Request) -> OpenOut:
        path = self._node(ino).path
        generation = self.client.namespace.generation
        children = self.client.manifest.listdir(path)  # raises ENOENT / ENOTDIR
        fh = self._new_fh()
        with self._lock:  # a snapshot sorted by name: offsets index it, valid across calls
            self._dirs[fh] = (path, sorted(children.items(), key=lambda kv: kv[0]), generation)
        return OpenOut(fh=fh)

    def _snapshot(self, fh: int) -> tuple:
        snapshot = self._dirs.get(fh)
        if snapshot is None:
            raise OSError(errno.EBADF, "unknown directory handle")
        return snapshot

    def readdir(self, ino: int, fh: int, offset: int, add: AddEntry) -> None:
        path, children, _ = self._snapshot(fh)
        for i in range(offset, len(children)):
            name, entry = children[i]
            with self._lock:
                child = self.inodes.number(InodeTable.child(path, name), entry)
            mode = stat.S_IFDIR if entry is None else stat.S_IFREG
            if not add(DirEntry(os.fsencode(name), child, mode, i + 1)):
                return

    def readdirplus(self, ino: int, fh: int, offset: int, add: AddEntryPlus) -> None:
        path, children, generation = self._snapshot(fh)
        for i in range(offset, len(children)):
            name, entry = children[i]
            child = InodeTable.child(path, name)
            with self._lock:
                inode = self.inodes.number(child, entry)
            if not add(os.fsencode(name), self._entry(inode, child, entry), i + 1):
                return
            with self._lock:
                self.inodes.remember(inode, child, entry, generation)  # the kernel took a reference

    def releasedir(self, ino: int, fh: int) -> None:
        with self._lock:
            self._dirs.pop(fh, None)

    # -- xattrs ----------------------------------------------------------------------------------
    def getxattr(self, ino: int, name: bytes, req: Request) -> bytes:
        entry = self._node(ino).entry
        if entry is not None:
            if name == XATTR_CACHED:
                return str(round(self.client.cached_fraction(entry), 4)).encode()
            if name == XATTR_VERSION:
                return entry.version.encode()
            if name == XATTR_UFS_PATH:
                return f"{entry.mount}:{entry.ufs_path}".encode()
        raise OSError(errno.ENODATA, "no such attribute")

    def listxattr(self, ino: int, req: Request) -> list[bytes]:
        return list(FILE_XATTRS) if self._node(ino).entry is not None else []

    # -- data ------------------------------------------------------------------------------------
    def open(self, ino: int, flags: int, req: Request) -> OpenOut:
        node = self._node(ino)
        if node.entry is None:
            raise OSError(errno.EISDIR, "is a directory")
        generation = self.client.namespace.generation
        if node.checked != generation:  # the manifest changed since: is this version still current?
            current = self.client.manifest.lookup(node.path)
            if current is None or current.version != node.entry.version:
                # An inode of an old version, reached through a directory entry cached before the
                # change: ESTALE makes the kernel look the path up again (and open the new inode).
                raise OSError(errno.ESTALE, "the file changed", node.path)
            node.checked = generation
        if self.no_open:
            raise OSError(errno.ENOSYS, "no-open mode")  # no OPEN/RELEASE for the rest of the session
        fh = self._new_fh()
        handle = Handle(self.client.open_entry(node.entry), ino, threading.Lock())  # metadata only, no I/O
        with self._lock:
            self._files[fh] = handle
        # An inode passed through before reuses its backing id: no cache lookup for the file.
        reuse = self.passthrough and self.session is not None and self.session.backing.reusable(ino)
        local = self.client.local_file(node.entry) if self.passthrough and not reuse else None
        return OpenOut(fh=fh, keep_cache=True, passthrough=local, reopen=self.passthrough)

    def _reader(self, ino: int) -> tuple[Handle, bool]:
        """No-open mode: ``(the handle of ino, whether it was made now)``, made on its first read
        (opening tells the client's read listeners). At most ``INODE_READERS`` are kept; the least
        recently read idle ones are closed first."""
        with self._lock:
            handle = self._readers.get(ino)
            if handle is not None:
                self._readers.move_to_end(ino)
                return handle, False
            node = self.inodes.node(ino)
        if node.entry is None:
            raise OSError(errno.EISDIR, "is a directory")
        new = Handle(self.client.open_entry(node.entry), ino, threading.Lock())
        with self._lock:
            handle = self._readers.setdefault(ino, new)
            old = []
            excess = len(self._readers) - INODE_READERS
            for i, h in self._readers.items() if excess > 0 else ():  # least recently read first
                if not h.lock.locked() and h is not handle:
                    old.append(i)
                    if len(old) == excess:
                        break
            dropped = [self._readers.pop(i) for i in old]
        for h in ([new] if handle is not new else []) + dropped:
            h.file.close()
        return handle, handle is new

    def read(self, ino: int, fh: int, offset: int, size: int):
        handle, told = self._reader(ino) if self.no_open or fh == 0 else (self._files.get(fh), True)
        if handle is None:
            raise OSError(errno.EBADF, "unknown file handle")
        if offset == 0 and not told:  # a file's read starts again: the plan's position, the trace
            self.client.reading(handle.file.entry)
        with handle.lock:
            code = handle.repeat_failure(offset, size)  # see datacache_fuse.handles
            if code is not None:
                raise OSError(code, "the read of this range just failed")
            try:
                return handle.file.view(offset, size)
            except OSError as err:
                if handle.record_failure(offset, size, errno_of(err)) == errno.ESTALE and (self.no_open or fh == 0):
                    self._drop_entry(ino)
                raise

    def _drop_entry(self, ino: int) -> None:
        """No-open mode: make the kernel forget the directory entry of ``ino``'s path before a read
        answers ESTALE, so the caller's next ``open`` looks the path up again (the reader waiting
        for this READ holds no directory lock)."""
        try:
            parent, name = posixpath.split(self._node(ino).path)
        except FileNotFoundError:
            return
        with self._lock:
            parent_ino = self.inodes.number(parent, None)
            held = parent_ino in self.inodes
        if held and self.session is not None:
            self.session.notify_inval_entry(parent_ino, os.fsencode(name))

    def release(self, ino: int, fh: int) -> None:
        with self._lock:
            handle = self._files.pop(fh, None)
        if handle is not None:
            handle.file.close()

    def reopened(self, ino: int) -> None:
        """A reopen answered by the session's compiled loop (``OpenOut.reopen``) is closed: the
        read listeners learn of it now, as :meth:`open` tells them of the others."""
        try:
            entry = self._node(ino).entry
        except FileNotFoundError:
            return
        if entry is not None:
            self.client.reading(entry)

    # -- manifest changes ------------------------------------------------------------------------
    def _on_change(self, old, new) -> None:
        """The client's listener (any thread, maybe a handler's): diff and invalidate on a thread
        of its own. Reopens answered by the session's compiled loop stop at once: each OPEN checks
        its version again (:meth:`open`)."""
        if self.session is not None and not self._stop.is_set():
            self.session.backing.retire_reopens()
            threading.Thread(target=self._invalidate, args=(old, new), name="datacache-fuse-inval",
                             daemon=True).start()

    def _invalidate(self, old, new) -> None:
        """Invalidate the kernel's directory entries that ``new`` contradicts (see the module's docstring)."""
        try:
            names = stale_names(old, new)
        except Exception:  # noqa: BLE001 - entries then expire after attr_timeout
            log.exception("could not diff the manifests; directory entries expire after %s s", self.attr_timeout)
            return
        sent = 0
        for parent, name in names:
            with self._lock:
                inode = self.inodes.number(parent, None)
                held = inode in self.inodes
            if held:
                try:
                    self.session.notify_inval_entry(inode, os.fsencode(name))
                except OSError as err:  # the session is gone
                    log.debug("invalidation of %s/%s: %s", parent, name, err)
                    return
                sent += 1
        if names:
            log.info("manifest changed: %d paths differ, %d directory entries invalidated", len(names), sent)
