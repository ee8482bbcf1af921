"""A FUSE session on a ``/dev/fuse`` descriptor: INIT, then worker threads answering requests.

Protocol: the kernel's ``include/uapi/linux/fuse.h`` (see :mod:`.abi`); the loop follows
go-fuse's ``fuse/server.go`` (one struct per opcode, a read buffer per reader).

- **INIT** is read and answered by :meth:`Session.init` in the calling thread. The session asks
  for what the kernel offers of: ``ASYNC_READ``, ``PARALLEL_DIROPS``, ``MAX_PAGES`` (reads of
  ``max_read`` bytes, 1 MiB), ``NO_OPEN_SUPPORT`` and ``NO_OPENDIR_SUPPORT`` (an ENOSYS answer
  to OPEN/OPENDIR switches the kernel to opening without asking), ``DO_READDIRPLUS`` (without
  ``READDIRPLUS_AUTO``: every chunk of a listing carries the entries' attributes, so a job that
  lists a directory and then opens its files makes no LOOKUP; with AUTO only the first chunk did:
  1,222 LOOKUPs for 2,000 files) when the operations implement ``readdirplus``, ``HAS_EXPIRE_ONLY``, and
  ``PASSTHROUGH`` (with ``max_stack_depth``) when wanted. What the kernel offered is kept in
  :attr:`Session.kernel`.
- **Workers**: :meth:`Session.start` starts ``workers`` threads, each reading its own clone of
  the descriptor (``FUSE_DEV_IOC_CLONE``: requests are shared, replies go back on the clone that
  read them) into a preallocated buffer with a blocking ``readv`` (the GIL is released while
  waiting). Replies are written with ``writev`` (header and payload, not joined).
- **Answers**: handlers come from one table, opcode -> method. Every request that would write
  answers EROFS, unknown ones ENOSYS; IOCTL is answered ENOTTY in the loop itself when the
  operations keep the default ``ioctl`` (Python < 3.14's buffered ``open()`` asks ``isatty()`` of
  every file): by the compiled :mod:`.pump` when it was built, which reads ``/dev/fuse`` without
  the GIL and hands Python only the other requests (a page-cache-hot file of a no-open mount then
  costs no Python: ``benchmarks.native_floor``, runs alternating with and without it, 28-41k
  against 28-33k files/s, daemon CPU a pass 0.02-0.05 s against 0.05-0.08 s), else by the Python
  loop; errors become errnos in :mod:`.errnos`; an unexpected
  exception is logged and answered EIO. FORGET, BATCH_FORGET and INTERRUPT get no reply (the
  handlers are synchronous and short, so an interrupt needs no action).
- **End**: the workers end when the kernel ends the connection (unmount: reads fail with ENODEV)
  or after DESTROY. :meth:`Session.wait` returns then; :meth:`Session.close` releases everything.
- **FUSE over io_uring** (``uring=True`` and offered by the kernel): requests arrive on one ring
  queue per CPU instead (:mod:`.ring_queue`), answered by the same handlers; one ``/dev/fuse``
  reader stays for FORGET, INTERRUPT and what comes before the queues are registered.
- **Passthrough**: an OPEN answered with ``OpenOut.passthrough`` (a local path) is registered
  through :class:`.passthrough.BackingFiles` and answered ``FOPEN_PASSTHROUGH`` with its backing
  id; the kernel reads that file directly and sends no READ for the handle. When it cannot be
  used the handle is served through READ (logged once per reason).
- **Notifications**: :meth:`Session.notify_inval_entry` and :meth:`Session.notify_inval_inode`.
  Do not call them from a handler of a request in the same directory (the kernel holds its lock
  until that request is answered).
"""

from __future__ import annotations

import collections
import errno
import functools
import logging
import os
import struct
import threading
from dataclasses import dataclass
from typing import Callable

from datacache.errors import DatacacheError
from datacache_fuse.kernel import abi
from datacache_fuse.kernel.abi import InitFlag, Op, OpenFlag
from datacache_fuse.kernel.errnos import errno_of
from datacache_fuse.kernel.fast_open import FAST_FH
from datacache_fuse.kernel.gate import ReaderGate, Turn
from datacache_fuse.kernel.operations import (Attr, DirEntry, EntryOut, OpenOut, Operations, Request,
                                              dirent_type)
from datacache_fuse.kernel.passthrough import BackingFiles
from datacache_fuse.kernel.pump import Pump, load as load_pump, load_fast
from datacache_fuse.kernel.ring_queue import RingQueue, possible_cpus

log = logging.getLogger("datacache_fuse")

MAX_READ = 1 << 20  # bytes per READ request (MAX_PAGES)
MAX_WRITE = 128 * 1024  # bytes: the read buffer must hold this plus headers; nothing is written
# Threads per CPU's ring queue, each with its RingQueue's entries (2): a request that waits (a
# UFS read) holds one thread, not the CPU's queue, and the kernel hands a request to the entry
# re-armed last, so a warm stream stays on few threads. Measured (2,000 x 100 KB, 4 reader
# processes, page cache warm, one entry per thread): with 1 thread per CPU some passes fell to
# ~1,200 files/s, with 4 none did.
RING_THREADS = 4
READERS = 2  # workers reading /dev/fuse at a time (see datacache_fuse.kernel.gate)
REOPEN_TELL_S = 0.02  # seconds from a RELEASE the compiled loops answered to telling the operations of it
_WRITE_ACCESS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT
_NO_REPLY = object()
_U32 = struct.Struct("=I")
_IOCTL = int(Op.IOCTL)
_ENOTTY = -errno.ENOTTY


class SessionError(Exception):
    """The kernel's first request was not INIT, or its protocol is not one this session speaks."""


@dataclass(frozen=True)
class KernelInfo:
    """What the kernel said in INIT: its protocol version, ``max_readahead`` (bytes), the flags it
    ``offered`` and the flags both sides ``agreed`` on (:class:`.abi.InitFlag` bits)."""

    major: int
    minor: int
    max_readahead: int
    offered: int
    agreed: int

    def has(self, flag: int) -> bool:
        return bool(self.agreed & flag)


def _timeout(seconds: float) -> tuple[int, int]:
    seconds = max(float(seconds), 0.0)
    whole = int(seconds)
    return whole, int((seconds - whole) * 1e9)


def _attr_fields(a: Attr) -> tuple:
    blocks = (a.size + 511) // 512 if a.blocks is None else a.blocks
    return (a.ino, a.size, blocks, a.atime_ns // 1_000_000_000, a.mtime_ns // 1_000_000_000,
            a.ctime_ns // 1_000_000_000, a.atime_ns % 1_000_000_000, a.mtime_ns % 1_000_000_000,
            a.ctime_ns % 1_000_000_000, a.mode, a.nlink, a.uid, a.gid, a.rdev, a.blksize, 0)


_NO_ATTR = (0,) * 16


def pack_entry(e: EntryOut) -> bytes:
    """``struct fuse_entry_out`` of ``e`` (a negative entry when ``e.ino`` is 0)."""
    ev, evn = _timeout(e.entry_timeout)
    av, avn = _timeout(e.attr_timeout)
    attr = _attr_fields(e.attr) if e.ino and e.attr is not None else _NO_ATTR
    return abi.ENTRY_OUT.pack(e.ino, e.generation, ev, av, evn, avn, *attr)


def _cstring(body) -> bytes:
    """The NUL-terminated string at the start of ``body``, without the NUL."""
    raw = bytes(body)
    end = raw.find(b"\0")
    return raw if end < 0 else raw[:end]


class Session:
    """Serve ``ops`` (an :class:`.operations.Operations`) on FUSE descriptor ``fd``.

    ``workers``: threads answering requests, of which ``readers`` read ``/dev/fuse`` at a time
    (plus one for each held up by a slow request: :mod:`.gate`); ``passthrough``: ask the kernel
    for passthrough (used by OPEN answers that name a file); ``max_stack_depth``: 1 lets the mount
    be stacked under an overlay, 2 lets backing files live on an overlay; ``max_read``: bytes per
    READ (a multiple of 4096); ``on_init``: called with the session once INIT is answered (e.g. to
    widen read-ahead); ``uring``: ask for FUSE over io_uring (:mod:`.ring_queue`; the kernel offers
    it only with the ``fuse`` module parameter ``enable_uring`` on), served by ``ring_threads``
    threads per CPU. The session owns ``fd`` from now on (closed by :meth:`close`).
    """

    def __init__(self, ops: Operations, fd: int, *, workers: int = 4, readers: int = READERS,
                 passthrough: bool = True, max_stack_depth: int = 1, max_read: int = MAX_READ, name: str = "fuse",
                 on_init: Callable[["Session"], None] | None = None, uring: bool = False,
                 ring_threads: int = RING_THREADS):
        if not 1 <= max_stack_depth <= abi.FILESYSTEM_MAX_STACK_DEPTH:
            raise ValueError(f"max_stack_depth={max_stack_depth}: must be 1 or 2")
        self.ops = ops
        self.fd = fd
        self.workers = max(1, int(workers))
        self.readers = max(1, int(readers))
        self.gate: ReaderGate | None = None  # made for the threads by start()
        self.want_passthrough = passthrough
        self.want_uring = uring
        # IOCTL answered ENOTTY by the request loops, without a handler, unless ops answer it
        self._ioctl_enotty = type(ops).ioctl is Operations.ioctl
        self._new_pump = load_pump() if self._ioctl_enotty else None  # ... in C when it was built
        self._pumps: list[Pump] = []
        self.ring_threads = max(1, int(ring_threads))
        self.rings: list[RingQueue] = []  # FUSE over io_uring: one queue per CPU, when agreed
        self.max_stack_depth = max_stack_depth
        self.max_read = max_read
        self.name = name
        self._on_init = on_init
        self.kernel: KernelInfo | None = None
        self.backing = BackingFiles(fd, enabled=False)
        if self._new_pump is not None:  # the compiled loops answer reopens of passed-through inodes
            self.backing.fast = load_fast()
        self.no_open = False  # OPEN answered ENOSYS: the kernel opens without asking
        self._passed_through = 0  # OPENs answered with FOPEN_PASSTHROUGH by Python
        self.no_opendir = False
        self._handles: dict[int, tuple[int, int | None]] = {}  # our fh -> (ops' fh, backing id)
        self._next_fh = 1
        self._fh_lock = threading.Lock()
        self._fds: list[int] = []
        self._threads: list[threading.Thread] = []
        self._counters: list[collections.Counter] = []
        self._ended = threading.Event()
        self._running = 0  # workers not yet ended (under _fh_lock)
        self._destroyed = False
        self._closed = False
        self._bufsize = max(abi.MIN_READ_BUFFER, MAX_WRITE + 4096)
        self._table: dict[int, Callable] = {
            Op.LOOKUP: self._lookup, Op.FORGET: self._forget, Op.BATCH_FORGET: self._batch_forget,
            Op.GETATTR: self._getattr, Op.OPEN: self._open, Op.READ: self._read, Op.RELEASE: self._release,
            Op.FLUSH: self._flush, Op.OPENDIR: self._opendir, Op.READDIR: self._readdir,
            Op.READDIRPLUS: self._readdirplus, Op.RELEASEDIR: self._releasedir, Op.STATFS: self._statfs,
            Op.GETXATTR: self._getxattr, Op.LISTXATTR: self._listxattr, Op.ACCESS: self._access,
            Op.IOCTL: self._ioctl, Op.LSEEK: self._lseek, Op.INTERRUPT: self._interrupt,
            Op.DESTROY: self._destroy,
        }
        for op in abi.WRITE_OPS:
            self._table[op] = self._erofs

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def passed_through(self) -> int:
        """OPENs answered with FOPEN_PASSTHROUGH, by Python and by the compiled loops."""
        return self._passed_through + (self.backing.fast.opens if self.backing.fast is not None else 0)

    @property
    def passthrough(self) -> bool:
        """Passthrough was negotiated and has not been refused for the whole session."""
        return self.backing.enabled

    def init(self) -> KernelInfo:
        """Read the kernel's INIT request from ``fd`` and answer it (blocks until it arrives, right
        after the mount). Raises :class:`SessionError` on a protocol the session cannot speak."""
        buf = bytearray(self._bufsize)
        n = os.readv(self.fd, [buf])
        length, opcode, unique = abi.IN_HEADER.unpack_from(buf)[:3]
        if opcode != Op.INIT:
            raise SessionError(f"the kernel's first request is opcode {opcode}, not INIT")
        body = memoryview(buf)[abi.IN_HEADER.size:min(length, n)]
        fields = (tuple(abi.INIT_IN.unpack_from(body)) if len(body) >= abi.INIT_IN.size
                  else (*struct.unpack_from("=IIII", body), 0))
        major, minor, max_readahead, flags, flags2 = fields
        if major != abi.KERNEL_VERSION:
            self._reply(self.fd, unique, -errno.EPROTO)
            raise SessionError(f"the kernel speaks FUSE {major}.{minor}; this session speaks 7.x")
        offered = flags | ((flags2 << 32) if flags & InitFlag.INIT_EXT else 0)
        want = (InitFlag.ASYNC_READ | InitFlag.PARALLEL_DIROPS | InitFlag.MAX_PAGES | InitFlag.NO_OPEN_SUPPORT
                | InitFlag.NO_OPENDIR_SUPPORT | InitFlag.INIT_EXT | InitFlag.HAS_EXPIRE_ONLY)
        if self.ops.readdirplus_enabled:
            want |= InitFlag.DO_READDIRPLUS
        if self.want_passthrough:
            want |= InitFlag.PASSTHROUGH
        if self.want_uring:
            want |= InitFlag.OVER_IO_URING
        agreed = offered & want
        self.kernel = KernelInfo(major, minor, max_readahead, offered, agreed)
        self.backing.enabled = bool(agreed & InitFlag.PASSTHROUGH)
        if self.want_passthrough and not self.backing.enabled:
            log.warning("%s: the kernel (FUSE 7.%d) offers no passthrough (Linux >= 6.9 with "
                        "CONFIG_FUSE_PASSTHROUGH); serving reads through the daemon", self.name, minor)
        if self.want_uring and not agreed & InitFlag.OVER_IO_URING:
            log.warning("%s: FUSE over io_uring was asked for, but the kernel (FUSE 7.%d) does not offer it (Linux "
                        ">= 6.14 with CONFIG_FUSE_IO_URING, and as root: echo Y > "
                        "/sys/module/fuse/parameters/enable_uring); serving through /dev/fuse", self.name, minor)
        out = abi.INIT_OUT.pack(
            abi.KERNEL_VERSION, abi.KERNEL_MINOR_VERSION, min(max_readahead, self.max_read),
            agreed & 0xFFFFFFFF, 64, 48, MAX_WRITE, 1, self.max_read // 4096, 0,
            (agreed >> 32) & 0xFFFFFFFF, self.max_stack_depth if self.backing.enabled else 0, 0)
        self._reply(self.fd, unique, 0, out)
        log.info("%s: FUSE 7.%d, agreed flags %#x of %#x offered%s", self.name, minor, agreed, offered,
                 ", passthrough on" if self.backing.enabled else "")
        self.ops.init(self)
        if self._on_init is not None:
            self._on_init(self)
        return self.kernel

    def start(self) -> None:
        """Start the worker threads (after :meth:`init`): with FUSE over io_uring agreed, one
        pinned thread per CPU's ring queue and one ``/dev/fuse`` reader (FORGET, INTERRUPT, and
        whatever comes before every queue is registered); else ``workers`` threads, ``readers``
        of them reading at a time."""
        threads = self.workers
        if self.kernel.has(InitFlag.OVER_IO_URING):
            threads = 1 if self._start_rings() else self.workers
        self.gate = ReaderGate(min(threads, self.readers))
        if threads > self.gate.readers:  # workers wait for a turn: hand turns off held-up ones
            self._spawn(self.gate.watch, f"{self.name}-gate")
        for i in range(threads):
            fd = self.fd if i == 0 else self._clone()
            self._spawn(functools.partial(self._worker, fd, self._counter()), f"{self.name}-{i}")
        if self.backing.fast is not None and self.backing.enabled:
            self.backing.fast.open_wake()
            threading.Thread(target=self._tell_reopens, name=f"{self.name}-reopens", daemon=True).start()

    def _tell_reopens(self) -> None:
        """Until the session ends: once the compiled loops answer a RELEASE, wait
        :data:`REOPEN_TELL_S` (the RELEASEs that follow are told together), then tell the
        operations of every reopen released since (:meth:`.Operations.reopened`)."""
        fast = self.backing.fast
        try:
            while True:
                fast.wait()
                if self._ended.wait(REOPEN_TELL_S):
                    return
                for ino in fast.drain():
                    try:
                        self.ops.reopened(ino)
                    except Exception:  # noqa: BLE001 - one listener's failure must not stop the others
                        log.exception("%s: reopened(%d) failed", self.name, ino)
        finally:
            if self._ended.is_set():  # the loops, which write to it, have returned
                fast.close_wake()

    def _counter(self) -> collections.Counter:
        """A new per-thread request counter, summed by :meth:`counts`."""
        counter: collections.Counter = collections.Counter()
        self._counters.append(counter)
        return counter

    def _spawn(self, body: Callable[[], None], name: str) -> None:
        """Run ``body`` on a daemon thread counted as running until it returns: the session has
        ended when the last one has (:meth:`wait`)."""
        def run() -> None:
            try:
                body()
            finally:
                with self._fh_lock:
                    self._running -= 1
                    if self._running == 0:
                        self._ended.set()
                        if self.backing.fast is not None:
                            self.backing.fast.wake()  # the reopens' drain thread ends

        with self._fh_lock:
            self._running += 1
        t = threading.Thread(target=run, name=name, daemon=True)
        self._threads.append(t)
        t.start()

    def _start_rings(self) -> bool:
        """Register a ring queue per possible CPU; False (logged) when one could not be set up
        (the kernel then keeps using ``/dev/fuse``, served by the usual readers)."""
        for cpu in [c for c in possible_cpus() for _ in range(self.ring_threads)]:
            queue = RingQueue(self.fd, cpu, self._answer, self._counter(), payload_size=max(self.max_read, MAX_WRITE),
                              name=self.name, ioctl_enotty=self._ioctl_enotty, fast=self.backing.fast)
            self.rings.append(queue)
            self._spawn(queue.run, f"{self.name}-ring{cpu}-{len(self.rings)}")
            queue.ready.wait()
            if queue.error is not None:
                log.warning("%s: FUSE over io_uring could not start (%s); serving through /dev/fuse",
                            self.name, queue.error)
                return False
        log.info("%s: FUSE over io_uring: %d threads on %d CPUs' queues", self.name, len(self.rings),
                 len(self.rings) // self.ring_threads)
        return True

    def _clone(self) -> int:
        import fcntl

        try:
            fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            return self.fd
        try:
            fcntl.ioctl(fd, abi.DEV_IOC_CLONE, bytearray(_U32.pack(self.fd)), True)
        except OSError as err:  # a kernel without clone: threads share the one descriptor
            log.debug("FUSE_DEV_IOC_CLONE: %s; workers share one descriptor", err)
            os.close(fd)
            return self.fd
        self._fds.append(fd)
        return fd

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every worker has ended (the session is over); False on ``timeout``
        (seconds)."""
        return self._ended.wait(timeout)

    @property
    def alive_workers(self) -> int:
        return sum(t.is_alive() for t in self._threads)

    def close(self) -> None:
        """Release backing ids, tell the operations (``destroy``) and close the descriptors.
        Call after :meth:`wait` (closing does not wake a reader blocked on a live connection)."""
        if self._closed:
            return
        self._closed = True
        self.backing.close_all()
        if not self._destroyed:
            self._destroyed = True
            self.ops.destroy()
        for fd in (*self._fds, self.fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds.clear()

    def counts(self) -> collections.Counter:
        """Requests received so far, by :class:`.abi.Op` (summed over the workers)."""
        total: collections.Counter = collections.Counter()
        for c in self._counters:
            total.update({Op(k) if k in Op._value2member_map_ else k: v for k, v in c.items()})
        total[Op.IOCTL] += sum(p.ioctls for p in self._pumps) + sum(q.ioctls for q in self.rings)
        if self.backing.fast is not None:
            total[Op.OPEN] += self.backing.fast.opens
        return +total

    # -- notifications ---------------------------------------------------------------------------
    def notify_inval_entry(self, parent: int, name: bytes, expire_only: bool = False) -> bool:
        """Make the kernel forget directory entry ``name`` of inode ``parent`` (``expire_only``:
        let it time out now but keep it for open files, when the kernel supports it). False when
        the kernel holds no such entry; raises ``OSError`` for other refusals."""
        flags = abi.EXPIRE_ONLY if expire_only and self.kernel and self.kernel.has(InitFlag.HAS_EXPIRE_ONLY) else 0
        head = abi.NOTIFY_INVAL_ENTRY_OUT.pack(parent, len(name), flags)
        return self._notify(abi.Notify.INVAL_ENTRY, head, bytes(name), b"\0")

    def notify_inval_inode(self, ino: int, offset: int = 0, length: int = 0) -> bool:
        """Make the kernel drop the cached attributes of ``ino`` and its cached pages from
        ``offset`` for ``length`` bytes (0: to the end; a negative offset: attributes only). False
        when the kernel does not know the inode."""
        return self._notify(abi.Notify.INVAL_INODE, abi.NOTIFY_INVAL_INODE_OUT.pack(ino, offset, length))

    def _notify(self, code: int, *parts: bytes) -> bool:
        size = abi.OUT_HEADER.size + sum(len(p) for p in parts)
        try:
            os.writev(self.fd, [abi.OUT_HEADER.pack(size, code, 0), *parts])
        except OSError as err:
            if err.errno == errno.ENOENT:
                return False
            raise
        return True

    # -- the loop --------------------------------------------------------------------------------
    def _worker(self, fd: int, counter: collections.Counter) -> None:
        gate = self.gate
        turn = gate.join()
        try:
            self._serve(fd, counter, turn)
        finally:
            gate.leave(turn)

    def _serve(self, fd: int, counter: collections.Counter, turn: Turn) -> None:
        buf = bytearray(self._bufsize)
        view = memoryview(buf)
        hsize = abi.IN_HEADER.size
        unpack = abi.IN_HEADER.unpack_from
        enotty = self._ioctl_enotty
        begin, end = self.gate.begin, self.gate.end
        read = functools.partial(os.readv, fd, [buf])
        if self._new_pump is not None:  # IOCTLs answered in C, never seen here
            pump = self._new_pump(fd, buf, self.backing.fast)
            self._pumps.append(pump)
            read = pump.read
        while not self._destroyed:
            try:
                n = read()
            except OSError as err:
                if err.errno == errno.ENOENT:  # the request was interrupted before we read it
                    continue
                if err.errno != errno.ENODEV:  # ENODEV: unmounted, the session is over
                    log.error("%s: reading /dev/fuse failed: %s; worker ends", self.name, err)
                return
            if n < hsize:
                log.error("%s: short read of %d bytes from /dev/fuse; worker ends", self.name, n)
                return
            length, opcode, unique, nodeid, uid, gid, pid, _, _ = unpack(buf)
            counter[opcode] += 1
            if opcode == _IOCTL and enotty:  # isatty() of every buffered open()
                self._reply(fd, unique, _ENOTTY)
                continue
            begin(turn)
            answer = self._answer(opcode, nodeid, view[hsize:min(length, n)], Request(uid, gid, pid))
            if answer is not None:
                self._reply(fd, unique, answer[0], *answer[1])
            end(turn)

    def _answer(self, opcode: int, nodeid: int, body, req: Request) -> tuple[int, tuple | list] | None:
        """Run the handler of ``opcode``: ``(0 or -errno, [reply payload parts])``, or None when
        the request takes no reply (FORGET, INTERRUPT)."""
        handler = self._table.get(opcode)
        try:
            if handler is None:
                raise OSError(errno.ENOSYS, "not implemented")
            out = handler(nodeid, body, req)
        except Exception as err:  # noqa: BLE001 - every request gets an answer
            code = errno_of(err)
            if isinstance(err, DatacacheError):  # a user's mistake (a missing secret): its own one line
                log.warning("%s: %s: EIO: %s", self.name, _opname(opcode), err)
            elif not isinstance(err, OSError):
                log.exception("%s: %s failed unexpectedly; answering EIO", self.name, _opname(opcode))
            elif code == errno.EIO:
                log.warning("%s: %s: EIO: %s", self.name, _opname(opcode), err)
            return -code, ()
        if out is _NO_REPLY:
            return None
        if out is None:
            return 0, ()
        return 0, out if isinstance(out, list) else (out,)

    def _reply(self, fd: int, unique: int, error: int, *payload) -> None:
        size = abi.OUT_HEADER.size + sum(len(p) for p in payload)
        try:
            os.writev(fd, [abi.OUT_HEADER.pack(size, error, unique), *payload])
        except OSError as err:
            # ENOENT: the request was interrupted and is gone; ENODEV: the connection is gone.
            if err.errno not in (errno.ENOENT, errno.ENODEV):
                log.warning("%s: reply to request %d failed: %s", self.name, unique, err)

    # -- handlers: each gets (nodeid, body, request) and returns the reply payload ---------------
    def _lookup(self, nodeid, body, req):
        return pack_entry(self.ops.lookup(nodeid, _cstring(body), req))

    def _forget(self, nodeid, body, req):
        self.ops.forget(nodeid, abi.FORGET_IN.unpack_from(body)[0])
        return _NO_REPLY

    def _batch_forget(self, nodeid, body, req):
        count = abi.BATCH_FORGET_IN.unpack_from(body)[0]
        base, one = abi.BATCH_FORGET_IN.size, abi.FORGET_ONE
        for i in range(count):
            ino, nlookup = one.unpack_from(body, base + i * one.size)
            try:
                self.ops.forget(ino, nlookup)
            except Exception:  # noqa: BLE001 - one bad forget must not drop the rest
                log.exception("%s: forget(%d, %d) failed", self.name, ino, nlookup)
        return _NO_REPLY

    def _getattr(self, nodeid, body, req):
        flags, _, fh = abi.GETATTR_IN.unpack_from(body)
        ops_fh = self._ops_fh(fh) if flags & abi.GETATTR_FH else None
        attr, timeout = self.ops.getattr(nodeid, ops_fh, req)
        secs, nsecs = _timeout(timeout)
        return abi.ATTR_OUT.pack(secs, nsecs, 0, *_attr_fields(attr))

    def _open(self, nodeid, body, req):
        flags = abi.OPEN_IN.unpack_from(body)[0]
        if flags & _WRITE_ACCESS:
            raise OSError(errno.EROFS, "read-only file system")
        try:
            out: OpenOut = self.ops.open(nodeid, flags, req)
        except OSError as err:
            if err.errno == errno.ENOSYS and self.kernel.has(InitFlag.NO_OPEN_SUPPORT):
                self.no_open = True
            raise
        backing_id = self.backing.open_handle(nodeid, out.passthrough)
        if backing_id is not None:
            open_flags = OpenFlag.PASSTHROUGH  # nothing outside PASSTHROUGH_MASK, or the open fails
        else:
            open_flags = ((OpenFlag.KEEP_CACHE if out.keep_cache else 0) | (OpenFlag.DIRECT_IO if out.direct_io else 0)
                          | (OpenFlag.NONSEEKABLE if out.nonseekable else 0))
        with self._fh_lock:
            fh = self._next_fh
            self._next_fh += 1
            self._handles[fh] = (out.fh, backing_id)
            self._passed_through += backing_id is not None
        if backing_id is not None and out.reopen:
            self.backing.list_reopens(nodeid, backing_id)
        return abi.OPEN_OUT.pack(fh, open_flags, backing_id or 0)

    def _ops_fh(self, fh: int) -> int:
        handle = self._handles.get(fh)
        return fh if handle is None else handle[0]  # fh 0: no-open mode

    def _read(self, nodeid, body, req):
        fh, offset, size = abi.READ_IN.unpack_from(body)[:3]
        data = self.ops.read(nodeid, self._ops_fh(fh), offset, size)
        if len(data) > size:
            data = memoryview(data)[:size]
        return data

    def _release(self, nodeid, body, req):
        fh = abi.RELEASE_IN.unpack_from(body)[0]
        if fh == FAST_FH:  # opened by a compiled loop, which left this RELEASE to us (see fast_open)
            self.backing.released_reopen(nodeid)
            self.ops.reopened(nodeid)
            return None
        with self._fh_lock:
            ops_fh, backing_id = self._handles.pop(fh, (fh, None))
        try:
            self.ops.release(nodeid, ops_fh)
        finally:
            self.backing.release_handle(nodeid, backing_id)

    def _flush(self, nodeid, body, req):
        self.ops.flush(nodeid, self._ops_fh(abi.FLUSH_IN.unpack_from(body)[0]))

    def _opendir(self, nodeid, body, req):
        try:
            out: OpenOut = self.ops.opendir(nodeid, abi.OPEN_IN.unpack_from(body)[0], req)
        except OSError as err:
            if err.errno == errno.ENOSYS and self.kernel.has(InitFlag.NO_OPENDIR_SUPPORT):
                self.no_opendir = True
            raise
        flags = (OpenFlag.CACHE_DIR if out.cache_dir else 0) | (OpenFlag.KEEP_CACHE if out.keep_cache else 0)
        return abi.OPEN_OUT.pack(out.fh, flags, 0)

    def _readdir(self, nodeid, body, req):
        fh, offset, size = abi.READ_IN.unpack_from(body)[:3]
        parts: list = []
        room = [size]
        pack = abi.DIRENT.pack

        def add(entry: DirEntry) -> bool:
            need = abi.dirent_size(len(entry.name))
            if need > room[0]:
                return False
            room[0] -= need
            pad = need - abi.DIRENT.size - len(entry.name)
            parts.append(pack(entry.ino, entry.next_offset, len(entry.name), dirent_type(entry.mode))
                         + entry.name + b"\0" * pad)
            return True

        self.ops.readdir(nodeid, fh, offset, add)
        return [b"".join(parts)]

    def _readdirplus(self, nodeid, body, req):
        fh, offset, size = abi.READ_IN.unpack_from(body)[:3]
        parts: list = []
        room = [size]
        pack = abi.DIRENT.pack

        def add(name: bytes, entry: EntryOut, next_offset: int) -> bool:
            need = abi.dirent_size(len(name), plus=True)
            if need > room[0]:
                return False
            room[0] -= need
            pad = need - abi.ENTRY_OUT.size - abi.DIRENT.size - len(name)
            mode = entry.attr.mode if entry.attr is not None else 0
            parts.append(pack_entry(entry) + pack(entry.ino, next_offset, len(name), dirent_type(mode))
                         + name + b"\0" * pad)
            return True

        self.ops.readdirplus(nodeid, fh, offset, add)
        return [b"".join(parts)]

    def _releasedir(self, nodeid, body, req):
        self.ops.releasedir(nodeid, abi.RELEASE_IN.unpack_from(body)[0])

    def _statfs(self, nodeid, body, req):
        s = self.ops.statfs(nodeid, req)
        return abi.STATFS_OUT.pack(s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize, 0)

    @staticmethod
    def _sized(value: bytes, size: int):
        if size == 0:  # the caller asks how big the value is
            return abi.GETXATTR_OUT.pack(len(value), 0)
        if len(value) > size:
            raise OSError(errno.ERANGE, "buffer too small")
        return value

    def _getxattr(self, nodeid, body, req):
        size = abi.GETXATTR_IN.unpack_from(body)[0]
        name = _cstring(body[abi.GETXATTR_IN.size:])
        return self._sized(bytes(self.ops.getxattr(nodeid, name, req)), size)

    def _listxattr(self, nodeid, body, req):
        size = abi.GETXATTR_IN.unpack_from(body)[0]
        return self._sized(b"".join(bytes(n) + b"\0" for n in self.ops.listxattr(nodeid, req)), size)

    def _access(self, nodeid, body, req):
        self.ops.access(nodeid, abi.ACCESS_IN.unpack_from(body)[0], req)

    def _ioctl(self, nodeid, body, req):
        fh, _, cmd, arg, in_size, out_size = abi.IOCTL_IN.unpack_from(body)
        in_data = bytes(body[abi.IOCTL_IN.size:abi.IOCTL_IN.size + in_size])
        data = bytes(self.ops.ioctl(nodeid, self._ops_fh(fh), cmd, arg, in_data, out_size))[:out_size]
        return [struct.pack("=iIII", 0, 0, 0, 0), data]

    def _lseek(self, nodeid, body, req):
        fh, offset, whence, _ = abi.LSEEK_IN.unpack_from(body)
        return abi.LSEEK_OUT.pack(self.ops.lseek(nodeid, self._ops_fh(fh), offset, whence))

    def _interrupt(self, nodeid, body, req):
        return _NO_REPLY  # handlers are synchronous: the request ends on its own

    def _destroy(self, nodeid, body, req):
        if not self._destroyed:
            self._destroyed = True
            self.ops.destroy()

    def _erofs(self, nodeid, body, req):
        raise OSError(errno.EROFS, "read-only file system")


def _opname(opcode: int) -> str:
    try:
        return Op(opcode).name
    except ValueError:
        return f"opcode {opcode}"
