"""The request loop's compiled fast path: :func:`load` gives a :class:`Pump` when the C part
(:file:`_pump.c`, built by ``pip install`` as ``datacache_fuse.kernel._pump``) is there.

A worker reading ``/dev/fuse`` through it spends no Python, and never takes the GIL, on an IOCTL:
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
from typing import Callable

log = logging.getLogger("datacache_fuse")


class Pump:
    """One worker thread's reader: :meth:`read` fills ``buf`` with the next request that is not
    an IOCTL. ``ioctls`` counts the IOCTLs answered so far (summed into the session's counts)."""

    __slots__ = ("_call", "_fd", "_ptr", "_size", "_ioctls", "_ref")

    def __init__(self, call, fd: int, buf: bytearray):
        self._call, self._fd, self._size = call, fd, len(buf)
        self._ref = (ctypes.c_char * len(buf)).from_buffer(buf)  # pins buf while the pump lives
        self._ptr = ctypes.addressof(self._ref)
        self._ioctls = ctypes.c_uint64(0)

    def read(self) -> int:
        """Bytes of the next request now in the buffer; raises ``OSError`` with the read's errno
        (ENOENT: the request was interrupted; ENODEV: the connection is over)."""
        n = self._call(self._fd, self._ptr, self._size, ctypes.byref(self._ioctls))
        if n < 0:
            raise OSError(-n, os.strerror(-n))
        return n

    @property
    def ioctls(self) -> int:
        return self._ioctls.value


def load() -> Callable[[int, bytearray], Pump] | None:
    """A factory ``(fd, buf) -> Pump`` when the compiled part loads; None (logged at debug level)
    when it was not built (no C compiler at install time) or does not load."""
    spec = importlib.util.find_spec("datacache_fuse.kernel._pump")
    if spec is None or not spec.origin:
        log.debug("datacache_fuse.kernel._pump was not built: every request is read by Python")
        return None
    try:
        call = ctypes.CDLL(spec.origin).dc_pump
    except OSError as err:
        log.debug("datacache_fuse.kernel._pump does not load (%s): every request is read by Python", err)
        return None
    call.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint64))
    call.restype = ctypes.c_long
    return functools.partial(Pump, call)
