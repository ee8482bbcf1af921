"""The FUSE request handlers: kernel requests translated into DatasetClient calls, nothing more.

What each handler does is a lookup in the manifest (``lookup``, ``getattr``, ``readdir``: cheap
dict operations, done on the event-loop thread) or a call into the Reader (``read``, xattrs,
``statfs``: they touch the disk cache or the network, so they run in a bounded worker pool and
never on the event loop). The layer knows nothing of workers, the UFS or the cache policy.

Rules, and why:

- **Read-only.** Every call that would change the tree or a file (write, create, mknod, mkdir,
  unlink, rmdir, rename, link, symlink, setattr, setxattr, removexattr, and ``open`` for writing)
  answers EROFS. The mount is also made with ``-o ro``, so the kernel refuses most of them first.
- **Caching by the kernel.** Entries and attributes carry ``entry_timeout``/``attr_timeout``
  (the runtime's ``fuse.attrTimeout``, seconds): repeated ``stat``/``lookup`` do not reach the
  daemon. An inode stands for one version of a file (see :mod:`.inodes`), so its pages never mix
  versions and ``open`` always sets ``keep_cache``: a later epoch is served from the kernel's page
  cache.
- **Changes reach the kernel.** When the current manifest changes (a per-file refresh, case C5, or
  a ``datacache sync`` by another process, noticed within ``reload_interval`` seconds by a
  ``stat`` of the stored manifest), every directory entry the kernel may hold that the new
  manifest contradicts is invalidated: paths deleted or at a new version, and names that were
  missing (negative entries) but now exist (cases C3, C4). ``open`` of an inode whose version is no
  longer current answers ESTALE, which makes the kernel look the path up again and open the new
  inode; handles already open keep reading their version (or get ESTALE once it is gone).
- **No OPEN, no RELEASE (no-open mode).** With pyfuse3 built by ``fuse/build_pyfuse3.py``
  (marker ``pyfuse3.READ_FH_ZERO_IS_INODE``), the first ``open`` answers ENOSYS: the kernel then
  opens files without asking the daemon and keeps their page cache (fs/fuse/file.c, "Default for
  no-open": ``FOPEN_KEEP_CACHE``), so a warm epoch over small files costs the daemon nothing. Reads
  carry the inode in place of a file handle; an inode stands for one version, so the version pin
  of case C3 holds. With stock pyfuse3, each ``open`` gets a handle and ``release`` drops it.
- **One Reader per handle.** A handle (per ``open``, or per inode in no-open mode, at most
  ``INODE_READERS`` kept, least recently read dropped first) has its own ``DatasetFile`` whose
  sequential detection drives read-ahead; reads of one handle are serialised (a DatasetFile keeps
  a current block and is not thread-safe), reads of different handles run in parallel in the
  pool. Read-ahead memory is one budget for the whole daemon (the block source's
  ``MemoryBudget``), not per handle.
- **Few copies, few hops per request.** A read whose block the Reader holds in memory (the
  current block, or the next one it loaded ahead) is answered on the event loop, with a view of
  the block (pyfuse3 replies from any buffer), not a copy. ``flush`` answers ENOSYS once, after
  which the kernel stops sending it: without no-open mode a warm small file costs two requests
  (open, release).
- **Errors** go through :mod:`.errmap`: ENOENT for missing paths, EIO only for real read failures.
  A read that failed is not retried against the UFS for ``RETRY_WINDOW`` seconds when the kernel
  asks again for the same range (it retries a failed read-ahead page by page), so an outage costs
  the reader one round of the UFS client's retries, not two.
- **Cache state where users look.** ``getfattr -n user.datacache.cached FILE`` is the cached
  fraction of the file's blocks (``"0.75"``); ``user.datacache.version`` is the pinned version;
  ``statfs`` (``df``) reports the cache: size = capacity, used = bytes cached.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import posixpath
import stat
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

import pyfuse3

from datacache_fuse.changes import stale_names  # noqa: F401 - also imported from here
from datacache_fuse.errmap import errno_of, translated
from datacache_fuse.handles import INODE_READERS, Handle
from datacache_fuse.inodes import InodeTable
from datacache_fuse.shown import (FILE_XATTRS, ST_BLKSIZE, STATFS_BLOCK, XATTR_CACHED, XATTR_UFS_PATH, XATTR_VERSION,
                                  SubdirCounts)

log = logging.getLogger("datacache_fuse")

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT


class DatacacheOperations(pyfuse3.Operations):
    """pyfuse3 handlers over one ``datacache.dataset_client.DatasetClient``.

    ``attr_timeout``: seconds the kernel may cache entries and attributes; ``workers``: threads
    for blocking calls (reads, xattrs, statfs); ``on_init``: called (no arguments, on the event
    loop) once the kernel's INIT request has been answered, e.g. to set the bdi read-ahead;
    ``reload_interval``: seconds between two checks for a new stored manifest (None: never);
    ``no_open``: use the kernel's no-open mode (None: when pyfuse3 has the read patch).
    """

    supports_dot_lookup = False
    enable_writeback_cache = False

    def __init__(self, client, *, attr_timeout: float = 60.0, workers: int = 32, on_init=None,
                 reload_interval: float | None = 1.0, no_open: bool | None = None):
        super().__init__()
        self.client = client
        self.attr_timeout = float(attr_timeout)
        self.inodes = InodeTable()
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="datacache-fuse")
        self._on_init = on_init
        self._uid, self._gid = os.getuid(), os.getgid()
        self._mount_ns = time.time_ns()
        self._files: dict[int, Handle] = {}  # fh -> handle (opens answered with a handle)
        if no_open is None:
            no_open = bool(getattr(pyfuse3, "READ_FH_ZERO_IS_INODE", False))
        self.no_open = no_open
        self._readers: OrderedDict[int, Handle] = OrderedDict()  # no-open mode: inode -> handle
        self._dirs: dict[int, tuple] = {}  # fh -> (dir path, [(name, FileEntry | None)])
        self._next_fh = 1
        self._reload_interval = reload_interval
        self._loop = None
        self._tasks: set = set()
        client.on_change(self._on_change)
        self._subdirs = SubdirCounts()

    # -- lifecycle -------------------------------------------------------------------------------
    def init(self) -> None:
        if self._on_init is not None:
            # init() runs inside the INIT request, before libfuse sends its reply; call_soon runs
            # after the reply has been written (and processed by the kernel).
            asyncio.get_running_loop().call_soon(self._on_init)
        self._loop = asyncio.get_running_loop()
        if self._reload_interval is not None:
            self._spawn(self._watch_manifest())

    def _spawn(self, coro) -> None:
        """Run ``coro`` as a task of the loop, referenced until it ends (asyncio keeps only weak
        references to tasks)."""
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch_manifest(self) -> None:
        """Pick up a ``datacache sync`` made by another process (the client calls
        :meth:`_on_change` when the stored manifest is new)."""
        while True:
            await asyncio.sleep(self._reload_interval)
            try:
                await self._blocking(self.client.maybe_reload)
            except Exception as err:  # a half-written or unreadable manifest: keep the current one
                log.warning("could not reload the manifest: %s", err)

    def close(self) -> None:
        """Close every open handle and stop the worker pool (after the main loop ended)."""
        for handle in (*self._files.values(), *self._readers.values()):
            handle.file.close()
        self._files.clear()
        self._readers.clear()
        self._dirs.clear()
        self.pool.shutdown(wait=False, cancel_futures=True)

    @property
    def open_files(self) -> int:
        return len(self._files)

    async def _blocking(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    # -- metadata --------------------------------------------------------------------------------
    @staticmethod
    def _resolve(manifest, path: str):
        """``(kind, entry)`` of a dataset path: ``("file", FileEntry)`` or ``("dir", None)``.
        Raises FileNotFoundError (never EIO) when the manifest has no such path."""
        entry = manifest.lookup(path)
        if entry is not None:
            return "file", entry
        if manifest.is_dir(path):
            return "dir", None
        raise FileNotFoundError(errno.ENOENT, "no such file or directory in the dataset", path)

    def _attrs(self, inode: int, path: str, entry) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = inode
        a.generation = 0
        a.entry_timeout = self.attr_timeout
        a.attr_timeout = self.attr_timeout
        a.st_uid, a.st_gid = self._uid, self._gid
        a.st_blksize = ST_BLKSIZE
        if entry is None:
            a.st_mode = stat.S_IFDIR | 0o555
            a.st_nlink = self._subdirs.nlink(self.client.manifest, path)
            a.st_size = 0
            a.st_blocks = 0
            ns = self._mount_ns
        else:
            a.st_mode = stat.S_IFREG | 0o444
            a.st_nlink = 1
            a.st_size = entry.size
            a.st_blocks = (entry.size + 511) // 512
            ns = int(entry.mtime * 1e9)
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = ns
        return a

    @translated
    async def lookup(self, parent_inode, name, ctx=None):
        path = InodeTable.child(self.inodes.node(parent_inode).path, os.fsdecode(name))
        generation = self.client.generation  # before the manifest: see DatasetClient.manifest
        try:
            kind, entry = self._resolve(self.client.manifest, path)
        except FileNotFoundError:
            # A negative entry cached for attr_timeout: the manifest is a snapshot, so a missing
            # name stays missing until the next mount (probing loops cost one request).
            neg = pyfuse3.EntryAttributes()
            neg.st_ino = 0
            neg.entry_timeout = self.attr_timeout
            return neg
        return self._attrs(self.inodes.lookup(path, entry, generation), path, entry)

    @translated
    async def getattr(self, inode, ctx=None):
        node = self.inodes.node(inode)  # the attributes of the inode's own version
        return self._attrs(inode, node.path, node.entry)

    async def forget(self, inode_list):
        for inode, count in inode_list:
            self.inodes.forget(inode, count)
            handle = self._readers.get(inode)
            if handle is not None and inode not in self.inodes and not handle.lock.locked():
                del self._readers[inode]
                handle.file.close()

    @translated
    async def opendir(self, inode, ctx):
        path = self.inodes.node(inode).path
        generation = self.client.generation
        children = self.client.manifest.listdir(path)  # raises ENOENT / ENOTDIR
        fh = self._new_fh()
        # A snapshot sorted by name: readdir offsets index it, so they stay valid across calls.
        self._dirs[fh] = (path, sorted(children.items(), key=lambda kv: kv[0]), generation)
        return fh

    @translated
    async def readdir(self, fh, start_id, token):
        snapshot = self._dirs.get(fh)
        if snapshot is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        path, children, generation = snapshot
        for i in range(start_id, len(children)):
            name, entry = children[i]
            child = InodeTable.child(path, name)
            inode = self.inodes.number(child, entry)
            if not pyfuse3.readdir_reply(token, os.fsencode(name), self._attrs(inode, child, entry), i + 1):
                break
            self.inodes.remember(inode, child, entry, generation)  # the kernel took a reference

    @translated
    async def releasedir(self, fh):
        self._dirs.pop(fh, None)

    @translated
    async def statfs(self, ctx):
        used, capacity = await self._blocking(self.client.usage)
        manifest = self.client.manifest
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = STATFS_BLOCK
        s.f_blocks = capacity // STATFS_BLOCK
        s.f_bfree = s.f_bavail = max(capacity - used, 0) // STATFS_BLOCK
        s.f_files = manifest.file_num
        s.f_ffree = s.f_favail = 0
        s.f_namemax = 255
        return s

    # -- xattrs ----------------------------------------------------------------------------------
    @translated
    async def getxattr(self, inode, name, ctx):
        entry = self.inodes.node(inode).entry
        if entry is not None:
            if name == XATTR_CACHED:
                fraction = await self._blocking(self.client.cached_fraction, entry)
                return str(round(fraction, 4)).encode()
            if name == XATTR_VERSION:
                return entry.version.encode()
            if name == XATTR_UFS_PATH:
                return f"{entry.mount}:{entry.ufs_path}".encode()
        raise pyfuse3.FUSEError(pyfuse3.ENOATTR)

    @translated
    async def listxattr(self, inode, ctx):
        return list(FILE_XATTRS) if self.inodes.node(inode).entry is not None else []

    # -- data ------------------------------------------------------------------------------------
    def _new_fh(self) -> int:
        fh = self._next_fh
        self._next_fh += 1
        return fh

    @translated
    async def open(self, inode, flags, ctx):
        if flags & _WRITE_FLAGS:
            raise pyfuse3.FUSEError(errno.EROFS)
        node = self.inodes.node(inode)
        if node.entry is None:
            raise pyfuse3.FUSEError(errno.EISDIR)
        generation = self.client.generation
        if node.checked != generation:  # the manifest changed since: is this version still current?
            current = self.client.manifest.lookup(node.path)
            if current is None or current.version != node.entry.version:
                # An inode of an old version, reached through a directory entry cached before the
                # change: ESTALE makes the kernel look the path up again (and open the new inode).
                raise pyfuse3.FUSEError(errno.ESTALE)
            node.checked = generation
        if self.no_open:
            # The kernel stops sending OPEN and RELEASE for the rest of the session; reads carry
            # the inode (see the module's docstring).
            raise pyfuse3.FUSEError(errno.ENOSYS)
        fh = self._new_fh()
        self._files[fh] = Handle(self.client.open_entry(node.entry), inode, asyncio.Lock())  # metadata only, no I/O
        return pyfuse3.FileInfo(fh=fh, keep_cache=True, direct_io=False)

    def _reader(self, inode: int) -> Handle:
        """No-open mode: the handle of ``inode``, made on its first read. At most
        ``INODE_READERS`` are kept; the least recently read idle ones are closed first."""
        handle = self._readers.get(inode)
        if handle is not None:
            self._readers.move_to_end(inode)
            return handle
        node = self.inodes.node(inode)
        if node.entry is None:
            raise pyfuse3.FUSEError(errno.EISDIR)
        handle = self._readers[inode] = Handle(self.client.open_entry(node.entry), inode, asyncio.Lock())
        excess = len(self._readers) - INODE_READERS
        if excess > 0:
            for old in [i for i, h in self._readers.items() if not h.lock.locked()][:excess]:
                self._readers.pop(old).file.close()
        return handle

    @translated
    async def read(self, fh, off, size):
        handle = self._reader(fh) if self.no_open else self._files.get(fh)
        if handle is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        async with handle.lock:
            code = handle.repeat_failure(off, size)  # see datacache_fuse.handles
            if code is not None:
                raise pyfuse3.FUSEError(code)
            bs = self.client.block_size
            end = min(off + size, handle.file.size)
            if end <= off:
                return b""
            first, last = off // bs, (end - 1) // bs
            if first == last and handle.file.holds(first):
                # The Reader keeps the block under its cursor: this read is a view of memory,
                # cheaper on the loop than a round trip through the pool.
                return handle.file.view(off, size)
            try:
                return await self._blocking(handle.file.view, off, size)
            except OSError as err:
                if handle.record_failure(off, size, errno_of(err)) == errno.ESTALE and self.no_open:
                    await self._drop_entry(handle.inode)
                raise

    async def _drop_entry(self, inode: int) -> None:
        """No-open mode: make the kernel forget the directory entry of ``inode``'s path before a
        read answers ESTALE, so the caller's next ``open`` looks the path up again and gets the
        new version's inode (with handles, ``open`` of a stale inode answers ESTALE instead).
        Synchronous, from the pool: the reader waiting for this READ holds no directory lock."""
        try:
            parent, name = posixpath.split(self.inodes.node(inode).path)
        except FileNotFoundError:
            return
        parent_inode = self.inodes.number(parent, None)
        if parent_inode in self.inodes:
            try:
                await self._blocking(pyfuse3.invalidate_entry, parent_inode, os.fsencode(name))
            except OSError:  # the kernel holds no such entry any more
                pass

    async def flush(self, fh):
        # Nothing is ever dirty. ENOSYS makes the kernel stop sending FLUSH on every close() for
        # the rest of the session (fuse_flush sets fc->no_flush): one round trip less per file.
        raise pyfuse3.FUSEError(errno.ENOSYS)

    @translated
    async def release(self, fh):
        handle = self._files.pop(fh, None)
        if handle is not None:
            handle.file.close()

    @translated
    async def access(self, inode, mode, ctx):
        self.inodes.node(inode)
        return not mode & os.W_OK

    # -- read-only: everything that would write -----------------------------------------------
    async def _erofs(self, *args, **kwargs):
        raise pyfuse3.FUSEError(errno.EROFS)

    setattr = mknod = mkdir = unlink = rmdir = symlink = rename = link = _erofs
    write = create = setxattr = removexattr = _erofs

    async def fsync(self, fh, datasync):
        return None  # nothing is ever dirty

    async def fsyncdir(self, fh, datasync):
        return None

    async def readlink(self, inode, ctx):
        raise pyfuse3.FUSEError(errno.EINVAL)  # the dataset has no symlinks

    # -- manifest changes ------------------------------------------------------------------------
    def _on_change(self, old, new) -> None:
        """The client's listener (any thread): handle the change on the event loop."""
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._spawn, self._invalidate(old, new))
            except RuntimeError:  # the loop has ended: nothing is mounted any more
                pass

    async def _invalidate(self, old, new) -> None:
        """Invalidate the kernel's directory entries that ``new`` contradicts (see the module's
        docstring). The diff runs in the pool (O(files), Arrow); the loop only sends the names
        under directories the kernel holds."""
        try:
            names = await self._blocking(stale_names, old, new)
        except Exception:
            log.exception("could not diff the manifests; directory entries expire after %s s", self.attr_timeout)
            return
        sent = 0
        for parent, name in names:
            inode = self.inodes.number(parent, None)
            if inode in self.inodes:
                pyfuse3.invalidate_entry_async(inode, os.fsencode(name), ignore_enoent=True)
                sent += 1
        if names:
            log.info("manifest changed: %d paths differ, %d directory entries invalidated", len(names), sent)
