"""The request loops' compiled fast path: :func:`load` gives a :class:`Pump` (``/dev/fuse``) and
:func:`load_ring` a :class:`RingPump` (a FUSE-over-io_uring queue) when the C part
(:file:`_pump.c`, built by ``pip install`` as ``datacache_fuse.kernel._pump``) is there.

A worker reading requests through either spends no Python, and never takes the GIL, on an IOCTL:
``ctypes`` releases the GIL for the call, and the C loop answers every IOCTL ENOTTY (the answer
to ``isatty()``, which Python < 3.14's buffered ``open()`` asks of every file; fs/fuse/ioctl.c
forwards each one) and returns only at another request. On a no-open mount a page-cache-hot
file costs only that IOCTL, so a hot small-file epoch reaches the daemon without waking Python.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import logging
import os
from typing import Callable, Sequence

from datacache_fuse.kernel.fast_open import FastOpens, FastTable
from datacache_fuse.kernel.uring import Ring, RingState

log = logging.getLogger("datacache_fuse")


class Pump:
    """One worker thread's reader: :meth:`read` fills ``buf`` with the next request that is not
    an IOCTL, nor an OPEN or RELEASE answered from ``fast`` (a :class:`~.fast_open.FastOpens`,
    or None). ``ioctls`` counts the IOCTLs answered so far (summed into the session's counts)."""

    __slots__ = ("_call", "_fd", "_ptr", "_size", "_ioctls", "_ref", "_fast")

    def __init__(self, call, fd: int, buf: bytearray, fast: FastOpens | None = None):
        self._call, self._fd, self._size = call, fd, len(buf)
        self._ref = (ctypes.c_char * len(buf)).from_buffer(buf)  # pins buf while the pump lives
        self._ptr = ctypes.addressof(self._ref)
        self._ioctls = ctypes.c_uint64(0)
        self._fast = fast.pointer if fast is not None else None

    def read(self) -> int:
        """Bytes of the next request now in the buffer; raises ``OSError`` with the read's errno
        (ENOENT: the request was interrupted; ENODEV: the connection is over)."""
        n = self._call(self._fd, self._ptr, self._size, ctypes.byref(self._ioctls), self._fast)
        if n < 0:
            raise OSError(-n, os.strerror(-n))
        return n

    @property
    def ioctls(self) -> int:
        return self._ioctls.value


class _Queue(ctypes.Structure):
    """``struct dc_queue`` of :file:`_pump.c`: a ring queue's ``/dev/fuse`` descriptor, queue id
    and entries (entry i's header buffer and iovec pair; i is its commands' user_data)."""

    _fields_ = [("fuse_fd", ctypes.c_int32), ("qid", ctypes.c_uint32), ("entries", ctypes.c_uint32),
                ("headers", ctypes.POINTER(ctypes.c_void_p)), ("iovs", ctypes.POINTER(ctypes.c_void_p))]


class RingPump:
    """One ring queue thread's reader: :meth:`next` submits what ``ring`` has queued, answers
    every IOCTL request, and the OPENs and RELEASEs ``fast`` answers (a
    :class:`~.fast_open.FastOpens`, or None), in C (its entry re-armed at once) and returns the
    next other completion. ``headers`` and ``iovs``: each registered entry's header buffer and
    iovec pair addresses, by entry index (the buffers must outlive the pump)."""

    __slots__ = ("_call", "_state", "_queue", "_arrays", "_ioctls", "_res", "_fast")

    def __init__(self, call, ring: Ring, fuse_fd: int, qid: int, headers: Sequence[int], iovs: Sequence[int],
                 fast: FastOpens | None = None):
        self._call, self._state = call, ring.state  # the ring's shared state (addresses and bookkeeping)
        n = len(headers)
        self._arrays = ((ctypes.c_void_p * n)(*headers), (ctypes.c_void_p * n)(*iovs))
        self._queue = _Queue(fuse_fd, qid, n, ctypes.cast(self._arrays[0], ctypes.POINTER(ctypes.c_void_p)),
                             ctypes.cast(self._arrays[1], ctypes.POINTER(ctypes.c_void_p)))
        self._ioctls = ctypes.c_uint64(0)
        self._res = ctypes.c_int32(0)
        self._fast = fast.pointer if fast is not None else None

    def next(self) -> tuple[int, int]:
        """``(entry index, result)`` of the next completion that is not an IOCTL request (result:
        0, or the entry's -errno, ENOTCONN and the like once the connection ends). Raises
        ``OSError`` with the errno of ``io_uring_enter`` (or EBUSY: the submission queue is full)."""
        n = self._call(ctypes.byref(self._state), ctypes.byref(self._queue), ctypes.byref(self._ioctls),
                       ctypes.byref(self._res), self._fast)
        if n < 0:
            raise OSError(-n, os.strerror(-n))
        return n, self._res.value

    @property
    def ioctls(self) -> int:
        return self._ioctls.value


def _library() -> ctypes.CDLL | None:
    """The compiled part; None (logged at debug level) when it was not built (no C compiler at
    install time) or does not load."""
    spec = importlib.util.find_spec("datacache_fuse.kernel._pump")
    if spec is None or not spec.origin:
        log.debug("datacache_fuse.kernel._pump was not built: every request is read by Python")
        return None
    try:
        return ctypes.CDLL(spec.origin)
    except OSError as err:
        log.debug("datacache_fuse.kernel._pump does not load (%s): every request is read by Python", err)
        return None


def load() -> Callable[[int, bytearray], Pump] | None:
    """A factory ``(fd, buf) -> Pump`` when the compiled part loads, else None."""
    lib = _library()
    if lib is None:
        return None
    call = lib.dc_pump
    call.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint64),
                     ctypes.POINTER(FastTable))
    call.restype = ctypes.c_long
    return functools.partial(Pump, call)


def load_ring() -> Callable[..., RingPump] | None:
    """A factory ``(ring, fuse_fd, qid, headers, iovs) -> RingPump`` when the compiled part loads
    (and has the ring loop), else None."""
    lib = _library()
    call = getattr(lib, "dc_ring_pump", None) if lib is not None else None
    if call is None:
        return None
    call.argtypes = (ctypes.POINTER(RingState), ctypes.POINTER(_Queue), ctypes.POINTER(ctypes.c_uint64),
                     ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(FastTable))
    call.restype = ctypes.c_long
    return functools.partial(RingPump, call)


def load_fast() -> FastOpens | None:
    """A new :class:`~.fast_open.FastOpens` table when the compiled part loads (and answers
    OPENs), else None."""
    lib = _library()
    if lib is None or getattr(lib, "dc_fast_drain", None) is None:
        return None
    ptr = ctypes.POINTER(FastTable)
    for name, args in (("dc_fast_put", (ptr, ctypes.c_uint64, ctypes.c_int32)),
                       ("dc_fast_retire", (ptr, ctypes.c_uint64)), ("dc_fast_release", (ptr, ctypes.c_uint64)),
                       ("dc_fast_drain", (ptr, ctypes.POINTER(ctypes.c_uint64), ctypes.c_int,
                                          ctypes.POINTER(ctypes.c_uint64)))):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ctypes.c_int
    return FastOpens(lib)
