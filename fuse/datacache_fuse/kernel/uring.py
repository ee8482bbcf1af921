"""A minimal io_uring in pure Python (``ctypes`` syscalls and ``mmap``): the transport of FUSE over
io_uring.

Source: ``include/uapi/linux/io_uring.h`` and ``io_uring_setup(2)``/``io_uring_enter(2)``: the
submission queue (SQ) ring, its array of indexes into the SQE array, and the completion queue
(CQ) ring, each shared with the kernel through ``mmap``. Only what FUSE needs is here: 128-byte
SQEs (``IORING_SETUP_SQE128``, for ``IORING_OP_URING_CMD`` with its 80-byte command area), one
submitting thread per ring (``SINGLE_ISSUER`` + ``DEFER_TASKRUN``: the kernel's task work for the
ring runs when that thread waits in ``io_uring_enter``, on its own CPU).

Ordering: the SQE bytes are written before the SQ tail, and the CQ head is written after the CQE
is read, each a plain store through ``mmap``; x86-64's store order (TSO) makes that enough, so
:class:`Ring` refuses other machines (:func:`supported`).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import platform
import struct

NR_SETUP, NR_ENTER = 425, 426  # x86-64 (the same numbers on every architecture since 5.1)
SETUP_SQE128 = 1 << 10
SETUP_SINGLE_ISSUER = 1 << 12
SETUP_DEFER_TASKRUN = 1 << 13
ENTER_GETEVENTS = 1 << 0
OFF_SQ_RING, OFF_SQES = 0, 0x10000000
OP_URING_CMD = 46
SQE_SIZE = 128
CQE = struct.Struct("=QiI")  # user_data, res, flags
_PARAMS = struct.Struct("=7I3I" + "8IQ" + "8IQ")  # io_uring_params with io_sqring/io_cqring_offsets
# An SQE of IORING_OP_URING_CMD: opcode, flags, ioprio, fd, cmd_op, pad, addr, len, uring_cmd_flags,
# user_data, buf_index, personality, file_index; then the command area (80 bytes) at offset 48.
SQE_HEAD = struct.Struct("=BBHiIIQIIQHHI")
CMD_OFFSET = 48


class RingState(ctypes.Structure):
    """A ring's shared state, the layout of ``struct dc_ring`` in :file:`_pump.c`: the mapped
    ring's fields (addresses) and the ring's own bookkeeping, ``tail`` (the next SQ tail) and
    ``pending`` (SQEs queued, not yet submitted), updated by :class:`Ring` and by the C loop
    alike (from the ring's one thread)."""

    _fields_ = [(name, ctypes.c_void_p) for name in ("sq_head", "sq_tail", "sq_array", "cq_head", "cq_tail",
                                                       "sqes", "cqes")] + \
        [("sq_mask", ctypes.c_uint32), ("sq_entries", ctypes.c_uint32), ("cq_mask", ctypes.c_uint32),
         ("fd", ctypes.c_int32), ("tail", ctypes.c_uint32), ("pending", ctypes.c_uint32)]


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def supported() -> bool:
    """Whether this module can drive io_uring here (x86-64 Linux; see the module docstring)."""
    return platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64")


class Ring:
    """One io_uring of ``entries`` SQEs (a power of two), for the calling thread only.

    Raises ``OSError`` from ``io_uring_setup`` (ENOSYS: no io_uring; EPERM: disabled by
    ``kernel.io_uring_disabled``; EINVAL: a flag this kernel lacks)."""

    def __init__(self, entries: int = 8):
        if not supported():
            raise OSError(errno.ENOSYS, f"io_uring from Python needs x86-64 Linux, not {platform.machine()}")
        params = ctypes.create_string_buffer(_PARAMS.size)
        struct.pack_into("=3I", params, 0, 0, 0, SETUP_SQE128 | SETUP_SINGLE_ISSUER | SETUP_DEFER_TASKRUN)
        fd = _syscall(NR_SETUP, ctypes.c_uint(entries), params)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"io_uring_setup: {os.strerror(err)}")
        self.fd = fd
        p = _PARAMS.unpack_from(params)
        sq_entries, cq_entries = p[0], p[1]
        sq = p[10:19]  # head, tail, ring_mask, ring_entries, flags, dropped, array, resv1, user_addr
        cq = p[19:28]  # head, tail, ring_mask, ring_entries, overflow, cqes, flags, resv1, user_addr
        sq_size = sq[6] + sq_entries * 4
        cq_size = cq[5] + cq_entries * CQE.size
        try:  # one map of both rings (IORING_FEAT_SINGLE_MMAP: every kernel with DEFER_TASKRUN has it)
            self._sq_map = self._cq_map = self._map(max(sq_size, cq_size), OFF_SQ_RING)
            self._sqes = self._map(sq_entries * SQE_SIZE, OFF_SQES)
        except OSError:
            os.close(fd)
            raise
        self._sq_head, self._sq_tail, self._sq_array = sq[0], sq[1], sq[6]
        self._sq_mask = struct.unpack_from("=I", self._sq_map, sq[2])[0]
        self._cq_head, self._cq_tail, self._cqes = cq[0], cq[1], cq[5]
        self._cq_mask = struct.unpack_from("=I", self._cq_map, cq[2])[0]
        self.sq_entries = sq_entries
        # The maps' addresses, for the C loop (anchors dropped by close(): an mmap with exports cannot close)
        self._anchors = [ctypes.c_char.from_buffer(m) for m in (self._sq_map, self._sqes)]
        ring, sqes = (ctypes.addressof(a) for a in self._anchors)
        self.state = RingState(ring + self._sq_head, ring + self._sq_tail, ring + self._sq_array, ring + self._cq_head,
                               ring + self._cq_tail, sqes, ring + self._cqes, self._sq_mask, sq_entries,
                               self._cq_mask, fd, struct.unpack_from("=I", self._sq_map, self._sq_tail)[0], 0)

    def _map(self, size: int, offset: int) -> mmap.mmap:
        return mmap.mmap(self.fd, size, mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                         mmap.PROT_READ | mmap.PROT_WRITE, offset=offset)

    def uring_cmd(self, fd: int, cmd_op: int, cmd: bytes, user_data: int, addr: int = 0, length: int = 0) -> None:
        """Queue an ``IORING_OP_URING_CMD`` on ``fd`` (its command area: ``cmd``, at most 80 bytes);
        sent by the next :meth:`submit_and_wait`. Raises ``OSError(EBUSY)`` when the SQ is full."""
        head = struct.unpack_from("=I", self._sq_map, self._sq_head)[0]
        state = self.state
        if (state.tail - head) & 0xFFFFFFFF >= self.sq_entries:
            raise OSError(errno.EBUSY, "io_uring submission queue full")
        index = state.tail & self._sq_mask
        base = index * SQE_SIZE
        SQE_HEAD.pack_into(self._sqes, base, OP_URING_CMD, 0, 0, fd, cmd_op, 0, addr, length, 0, user_data, 0, 0, 0)
        self._sqes[base + CMD_OFFSET:base + SQE_SIZE] = cmd.ljust(SQE_SIZE - CMD_OFFSET, b"\0")  # every SQE byte set
        struct.pack_into("=I", self._sq_map, self._sq_array + 4 * index, index)
        state.tail = (state.tail + 1) & 0xFFFFFFFF
        struct.pack_into("=I", self._sq_map, self._sq_tail, state.tail)
        state.pending += 1

    def submit_and_wait(self, wait: int = 1) -> list[tuple[int, int]]:
        """Submit what is queued and wait for at least ``wait`` completions (the GIL is released
        while waiting); returns every completion ready, ``[(user_data, res), ...]``. Raises
        ``OSError`` from ``io_uring_enter`` (EINTR is retried)."""
        while True:
            state = self.state
            done = _syscall(NR_ENTER, self.fd, state.pending, wait, ENTER_GETEVENTS, None, 0)
            if done >= 0:
                state.pending -= min(done, state.pending)
                break
            err = ctypes.get_errno()
            if err != errno.EINTR:
                raise OSError(err, f"io_uring_enter: {os.strerror(err)}")
        return self.completions()

    def completions(self) -> list[tuple[int, int]]:
        """Reap every CQE ready: ``[(user_data, res), ...]``."""
        out = []
        head = struct.unpack_from("=I", self._cq_map, self._cq_head)[0]
        tail = struct.unpack_from("=I", self._cq_map, self._cq_tail)[0]
        while head != tail:
            user_data, res, _ = CQE.unpack_from(self._cq_map, self._cqes + (head & self._cq_mask) * CQE.size)
            out.append((user_data, res))
            head = (head + 1) & 0xFFFFFFFF
        struct.pack_into("=I", self._cq_map, self._cq_head, head)
        return out

    def close(self) -> None:
        self._anchors.clear()
        for m in {id(m): m for m in (self._sq_map, self._cq_map, self._sqes)}.values():
            m.close()
        os.close(self.fd)
