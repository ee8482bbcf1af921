"""Reopens answered by the compiled request loops: the table of inodes whose OPEN needs no Python.

A passthrough OPEN of a file passed through before (its backing id kept, see
:mod:`.passthrough`) costs the daemon nothing but a dictionary lookup, yet answering it in Python
took 140-180 us an ``open()`` + ``close()`` here (2 CPUs: the wake-up of a Python thread and the
GIL hand-off, not the Python itself), against ~5 us for the local file. The compiled loops
(``_pump.c``) answer such an OPEN themselves when its inode is listed in this table: the reply
passes the file through with the listed backing id and the handle ``FAST_FH``, and the loop
counts the handle in the inode's slot, and answers the handle's RELEASE too (uncounted, its inode
logged, so that the read listeners still learn of the file: :meth:`FastOpens.drain`). The counts
keep a retired slot's backing id registered until the kernel is done with every handle opened
through it (the kernel looks the id up in the opener's context, after the reply): the RELEASE of
a retired slot's last handle is left to Python's handler, which lets go of the id. Measured (one
process, ``open(path, "rb", buffering=0)`` + ``read(8)`` + ``close()`` of a cached file): 50-54
us through ``/dev/fuse`` (the synchronous OPEN still crosses to the other CPU) and 45 us over the
ring queues (24 us with the reader pinned to one CPU), against 139-178 and 177 us with both requests
answered by Python and 72-85 and 104-115 us with only the OPEN in C; ``benchmarks.kernel_transport``'s
reopen row, 4 processes: 43.9k opens a second against 16.9k (2026-12-06).

:class:`FastOpens` wraps the C table (``struct dc_fast``): ``put`` lists an inode, ``retire``
stops its opens, ``release`` uncounts a handle. Thread-safe: every call takes the table's spin
lock in C, as the loops do.
"""

from __future__ import annotations

import ctypes
import os
import threading

FAST_FH = 1 << 63  # the fh of every handle opened by the compiled loops (RELEASE carries it back)
SLOTS = 64  # inodes listed at most: a loop scans every slot per OPEN (~50 ns)


class _Slot(ctypes.Structure):
    """``struct dc_fast_slot``: an inode (0: a free slot), its backing id, the handles opened
    through it by the loops and not yet released, and whether it is retired."""

    _fields_ = [("nodeid", ctypes.c_uint64), ("backing_id", ctypes.c_int32), ("handles", ctypes.c_uint32),
                ("retired", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


LOG = 256  # FAST_LOG: the inodes of the last RELEASEs answered by the loops, kept for drain()


class FastTable(ctypes.Structure):
    """``struct dc_fast``: the spin lock, the slot count, OPENs answered by the loops, the slots,
    the log of the RELEASEs they answered (``logged`` so far, ``drained`` so far, the ring), and
    the eventfd a RELEASE logged into an empty log adds 1 to (``wake``, -1: none)."""

    _fields_ = [("lock", ctypes.c_uint32), ("size", ctypes.c_uint32), ("opens", ctypes.c_uint64),
                ("slots", ctypes.POINTER(_Slot)), ("logged", ctypes.c_uint64), ("drained", ctypes.c_uint64),
                ("log", ctypes.c_uint64 * LOG), ("wake", ctypes.c_int32), ("pad", ctypes.c_uint32)]


class FastOpens:
    """The table the compiled loops answer OPENs from, made from the loaded library ``lib``
    (:func:`datacache_fuse.kernel.pump.load_fast`) with ``size`` slots. Pass :attr:`pointer` to
    the loops; it must outlive them (the session keeps this object)."""

    def __init__(self, lib: ctypes.CDLL, size: int = SLOTS):
        self._slots = (_Slot * size)()
        self.table = FastTable(0, size, 0, ctypes.cast(self._slots, ctypes.POINTER(_Slot)), wake=-1)
        self._wake_lock = threading.Lock()  # orders wake() and close_wake(): never a write to a closed fd
        self.pointer = ctypes.pointer(self.table)
        self._put, self._retire, self._release = lib.dc_fast_put, lib.dc_fast_retire, lib.dc_fast_release
        self._drain = lib.dc_fast_drain
        self._out = (ctypes.c_uint64 * LOG)()
        self._lost = ctypes.c_uint64(0)
        self.lost = 0  # logged RELEASEs overwritten before a drain

    def put(self, ino: int, backing_id: int) -> bool:
        """List ``ino``: its read-only OPENs are answered with ``backing_id`` from now on. False when
        it is listed already or every slot is taken."""
        return self._put(self.pointer, ino, backing_id) == 1

    def retire(self, ino: int) -> int:
        """Stop answering ``ino``'s OPENs: 1 when its slot is free now (the caller lets go of its
        backing id), 0 when handles opened through it are still open (the release of the last one
        returns 1), -1 when it is not listed."""
        return self._retire(self.pointer, ino)

    def release(self, ino: int) -> int:
        """A handle of ``ino`` opened by a loop (fh :data:`FAST_FH`) is released: 1 when that freed
        its retired slot (the caller lets go of its backing id), 0 otherwise, -1 when ``ino`` has
        no counted handle."""
        return self._release(self.pointer, ino)

    def drain(self) -> list[int]:
        """The inodes of the RELEASEs the loops answered since the last call, oldest first (at most
        :data:`LOG`; older ones are counted in :attr:`lost`). One caller at a time."""
        n = self._drain(self.pointer, self._out, LOG, ctypes.byref(self._lost))
        self.lost += self._lost.value
        return self._out[:n]

    def open_wake(self) -> None:
        """Make the eventfd the loops add 1 to when they log a RELEASE into an empty log (see
        :meth:`wait`). Raises OSError."""
        self.table.wake = os.eventfd(0, os.EFD_CLOEXEC)

    def wait(self) -> None:
        """Block until a loop logs a RELEASE into an empty log (one wake-up per burst: an idle
        mount wakes no thread; before, a drain every 20 ms cost ~50 wake-ups a second) or
        :meth:`wake` is called. Only the thread that calls :meth:`close_wake` when done."""
        os.eventfd_read(self.table.wake)

    def wake(self) -> None:
        """End a :meth:`wait` (the session ended); nothing once the eventfd is closed."""
        with self._wake_lock:
            if self.table.wake >= 0:
                os.eventfd_write(self.table.wake, 1)

    def close_wake(self) -> None:
        """Close the eventfd, once the loops have returned (they write to it): by the thread that
        waited, so that no wait starts on a closed descriptor."""
        with self._wake_lock:
            fd, self.table.wake = self.table.wake, -1
            os.close(fd)

    @property
    def opens(self) -> int:
        """OPENs answered by the loops so far."""
        return self.table.opens
