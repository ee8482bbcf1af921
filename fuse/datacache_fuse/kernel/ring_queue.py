"""FUSE over io_uring: one queue per CPU, each served by a thread pinned to that CPU.

Source: the kernel's ``fs/fuse/dev_uring.c`` (Linux 6.14+, ``CONFIG_FUSE_IO_URING`` and the
``fuse`` module parameter ``enable_uring``) and ``include/uapi/linux/fuse.h``. Once INIT agreed
``FUSE_OVER_IO_URING``, the server registers ring entries (``FUSE_IO_URING_CMD_REGISTER``, an
``IORING_OP_URING_CMD`` on the ``/dev/fuse`` descriptor whose ``addr`` points to two iovecs: a
288-byte header buffer and a payload buffer of at least ``max(max_write, max_pages * 4096)``
bytes) for queue ``qid`` = a CPU. When every possible CPU's queue holds an entry the kernel sends
requests to the queue of the CPU the calling task runs on, completing that entry's command with
the request in its buffers: ``fuse_in_header`` at 0, the opcode's fixed argument at 128, the
other arguments in the payload, and at 256 ``fuse_uring_ent_in_out`` (``commit_id``,
``payload_sz``). The answer goes in the same buffers (``fuse_out_header`` at 0, the reply's
arguments in the payload, ``payload_sz``) and is sent with ``FUSE_IO_URING_CMD_COMMIT_AND_FETCH``,
which also re-arms the entry: one system call per request, and, the thread being pinned to the
requester's CPU, no wake-up of another CPU (about 60 us per round trip on this VM's two CPUs,
against a few on one). FORGET and INTERRUPT still arrive on ``/dev/fuse``; notifications are
still written there.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import struct
import threading
from typing import Callable

from datacache_fuse.kernel import abi
from datacache_fuse.kernel.fast_open import FastOpens
from datacache_fuse.kernel.operations import Request
from datacache_fuse.kernel.pump import RingPump, load_ring
from datacache_fuse.kernel.uring import Ring

log = logging.getLogger("datacache_fuse")

CMD_REGISTER, CMD_COMMIT_AND_FETCH = 1, 2
HEADER_SIZE = 288  # sizeof(struct fuse_uring_req_header)
OP_IN = 128  # offset of the opcode's fixed argument in the header buffer
ENT_IN_OUT = 256  # offset of struct fuse_uring_ent_in_out
_CMD = struct.Struct("=QQH6x")  # struct fuse_uring_cmd_req: flags, commit_id, qid
_ENT = struct.Struct("=QQI")  # fuse_uring_ent_in_out: flags, commit_id, payload_sz
_PAYLOAD_SZ = struct.Struct("=I")
_IOCTL = int(abi.Op.IOCTL)
_ENDED = (errno.ENOTCONN, errno.ECANCELED, errno.ECONNABORTED, errno.ENODEV)


ENABLE_URING = "/sys/module/fuse/parameters/enable_uring"  # the fuse module's switch (root only)


@contextlib.contextmanager
def enable_uring_while():
    """Turn the fuse module's ``enable_uring`` on inside the block and back to what it was after
    (under a lock, so concurrent users on one machine do not undo each other). The kernel reads it
    when a connection's INIT is answered and when its rings register; a connection that agreed
    keeps io_uring after. For benchmarks and tests, as root. Raises ``OSError`` (ENOENT: the
    kernel has no FUSE over io_uring; EACCES: not root)."""
    with open("/tmp/datacache-enable-uring.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open(ENABLE_URING) as f:
            before = f.read().strip()
        with open(ENABLE_URING, "w") as f:
            f.write("Y")
        try:
            yield
        finally:
            with open(ENABLE_URING, "w") as f:
                f.write(before)


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _Entry:
    """One ring entry's buffers (their addresses stay fixed: the kernel writes into them)."""

    def __init__(self, payload_size: int):
        self.header = ctypes.create_string_buffer(HEADER_SIZE)
        self.payload = ctypes.create_string_buffer(payload_size)
        self.iov = (_IoVec * 2)(_IoVec(ctypes.addressof(self.header), HEADER_SIZE),
                                _IoVec(ctypes.addressof(self.payload), payload_size))
        self.hv = memoryview(self.header).cast("B")
        self.pv = memoryview(self.payload).cast("B")


def possible_cpus() -> list[int]:
    """The kernel's possible CPUs (``/sys/devices/system/cpu/possible``, e.g. ``0-3``): it makes
    one queue per possible CPU and uses the ring only once each has an entry."""
    try:
        with open("/sys/devices/system/cpu/possible") as f:
            text = f.read().strip()
    except OSError:
        return list(range(os.cpu_count() or 1))
    cpus: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


class RingQueue:
    """Queue ``qid`` of a FUSE connection (``fd``: its ``/dev/fuse`` descriptor) with ``depth``
    entries of ``payload_size`` bytes, answered by ``answer(opcode, nodeid, body, request)`` ->
    ``(0 or -errno, [payload parts])``; ``counter`` counts requests by opcode (but for the IOCTLs
    that the compiled loop answers: :attr:`ioctls`). :meth:`run` is the thread's body; it returns
    when the connection ends (the entries complete with ENOTCONN)."""

    def __init__(self, fd: int, qid: int, answer: Callable, counter, *, depth: int = 2,
                 payload_size: int = 1 << 20, name: str = "fuse", ioctl_enotty: bool = False,
                 fast: FastOpens | None = None):
        self.fd, self.qid, self.depth = fd, qid, depth
        self.payload_size = payload_size
        self._answer = answer
        self._ioctl_enotty = ioctl_enotty  # IOCTL answered ENOTTY here, as the /dev/fuse loop does
        self.counter = counter
        self.name = name
        self.ready = threading.Event()
        self.error: OSError | None = None
        self._new_pump = load_ring() if ioctl_enotty else None  # IOCTLs answered in C when it was built
        self._pump: RingPump | None = None
        self._fast = fast  # reopens the compiled loop answers (see datacache_fuse.kernel.fast_open)

    def run(self) -> None:
        try:
            os.sched_setaffinity(0, {self.qid})  # this thread only: requests of this CPU wake it here
        except OSError as err:
            log.debug("%s: queue %d runs unpinned: %s", self.name, self.qid, err)
        try:
            ring = Ring(1 << max(1, (self.depth * 2 - 1).bit_length()))
        except OSError as err:
            self.error = err
            self.ready.set()
            return
        try:
            entries = [_Entry(self.payload_size) for _ in range(self.depth)]
            for i, e in enumerate(entries):
                ring.uring_cmd(self.fd, CMD_REGISTER, _CMD.pack(0, 0, self.qid), i, ctypes.addressof(e.iov), 2)
            ring.submit_and_wait(0)
            if self._new_pump is not None:
                self._pump = self._new_pump(ring, self.fd, self.qid, [ctypes.addressof(e.header) for e in entries],
                                            [ctypes.addressof(e.iov) for e in entries], self._fast)
            self.ready.set()
            self._serve(ring, entries)
        finally:
            ring.close()

    @property
    def ioctls(self) -> int:
        """IOCTL requests answered by the compiled loop (not in :attr:`counter`)."""
        return self._pump.ioctls if self._pump is not None else 0

    def _serve(self, ring: Ring, entries: list[_Entry]) -> None:
        live = len(entries)
        if self._pump is not None:
            pump = self._pump.next
            while live:
                live -= not self._handle(ring, entries, *pump())
            return
        while live:
            for index, res in ring.submit_and_wait(1):
                live -= not self._handle(ring, entries, index, res)

    def _handle(self, ring: Ring, entries: list[_Entry], index: int, res: int) -> bool:
        """Answer the request completed in entry ``index`` (``res``: 0 or -errno) and queue its
        commit; False when the entry is done (the connection ended, or it failed)."""
        if res < 0:
            if -res not in _ENDED:
                log.error("%s: queue %d entry %d failed: %s", self.name, self.qid, index, os.strerror(-res))
            return False
        e = entries[index]
        hv = e.hv
        length, opcode, unique, nodeid, uid, gid, pid, _, _ = abi.IN_HEADER.unpack_from(hv)
        _, commit_id, payload_sz = _ENT.unpack_from(hv, ENT_IN_OUT)
        self.counter[opcode] += 1
        if opcode == _IOCTL and self._ioctl_enotty:
            self._commit(ring, e, index, commit_id, unique, -errno.ENOTTY, ())
            return True
        try:
            fixed = length - abi.IN_HEADER.size - payload_sz
            body = bytes(hv[OP_IN:OP_IN + fixed]) + bytes(e.pv[:payload_sz]) if payload_sz else \
                hv[OP_IN:OP_IN + fixed]
            answer = self._answer(opcode, nodeid, body, Request(uid, gid, pid))
            error, parts = answer if answer is not None else (0, ())
        except Exception:  # noqa: BLE001 - an entry left unanswered would hang its caller
            log.exception("%s: queue %d: request %d (opcode %d) failed; answering EIO",
                          self.name, self.qid, unique, opcode)
            error, parts = -errno.EIO, ()
        self._commit(ring, e, index, commit_id, unique, error, parts)
        return True

    def _commit(self, ring: Ring, e: _Entry, index: int, commit_id: int, unique: int, error: int, parts) -> None:
        size = 0
        pv = e.pv
        for p in parts:
            n = len(p)
            if size + n > self.payload_size:  # cannot happen with max_read <= payload_size
                error, size = -errno.EIO, 0
                break
            pv[size:size + n] = p
            size += n
        abi.OUT_HEADER.pack_into(e.hv, 0, abi.OUT_HEADER.size + size, error, unique)
        _PAYLOAD_SZ.pack_into(e.hv, ENT_IN_OUT + 16, size)
        ring.uring_cmd(self.fd, CMD_COMMIT_AND_FETCH, _CMD.pack(0, commit_id, self.qid), index,
                       ctypes.addressof(e.iov), 2)
