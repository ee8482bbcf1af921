"""Mount, serve, unmount: a FUSE file system of :class:`.operations.Operations` in this process.

:class:`FuseServer` ties :mod:`.mount` and :class:`.session.Session` together for the daemon,
tests and benchmarks::

    with FuseServer(MyOps(), "/mnt/x", fsname="datacache:default/ds") as server:
        ...                      # the mount is live; server.session tells what was negotiated
    # unmounted (lazily), workers ended, descriptors closed

After INIT the mount's bdi read-ahead is widened to ``read_ahead_kib`` (the kernel sizes READ
requests by it, 128 KiB by default; the INIT reply resets it, see :mod:`datacache.mountinfo`).

The serving process must not touch the mount's pages while holding the GIL (an ``mmap`` of a file
on it read in this process): the page fault waits for a READ that the workers cannot answer
without the GIL. Plain ``read``/``stat`` calls release the GIL and are safe.
"""

from __future__ import annotations

import logging
import os

from datacache import mountinfo
from datacache_fuse.kernel import mount as kmount
from datacache_fuse.kernel.operations import Operations
from datacache_fuse.kernel.session import READERS, Session

log = logging.getLogger("datacache_fuse")


class FuseServer:
    """``ops`` mounted at ``mountpoint`` and served by ``workers`` threads (``readers`` of them
    reading requests at a time: :mod:`.gate`) while the ``with`` block (or between :meth:`start`
    and :meth:`stop`) runs.

    ``fsname``/``subtype``: the mount table's source and ``fuse.<subtype>`` type; ``passthrough``,
    ``max_stack_depth``: see :class:`.session.Session`; ``method``: see :func:`.mount.mount`;
    ``read_ahead_kib``: the bdi read-ahead (0 keeps the kernel's); ``options``: more kernel mount
    options; ``uring``: ask for FUSE over io_uring (see :mod:`.ring_queue`). Raises
    :class:`.mount.FuseMountError` when the mount is refused.
    """

    def __init__(self, ops: Operations, mountpoint: str, *, fsname: str = "datacache", subtype: str = "datacache",
                 workers: int = 4, readers: int = READERS, passthrough: bool = True, max_stack_depth: int = 1,
                 allow_other: bool = True, method: str = "auto", read_ahead_kib: int = 1024, options: tuple[str, ...] = (),
                 uring: bool = False):
        self.ops = ops
        self.mountpoint = mountinfo.canonical(mountpoint)
        self.fsname, self.subtype = fsname, subtype
        self.workers, self.readers = workers, readers
        self.passthrough, self.max_stack_depth = passthrough, max_stack_depth
        self.allow_other, self.method, self.read_ahead_kib = allow_other, method, read_ahead_kib
        self.options = tuple(options)
        self.uring = uring
        self.mounted: kmount.Mounted | None = None
        self.session: Session | None = None

    def start(self) -> Session:
        """Mount, answer INIT, start the workers; returns the session."""
        self.mounted = kmount.mount(self.mountpoint, self.fsname, self.subtype, allow_other=self.allow_other,
                                    options=self.options, method=self.method)
        self.session = Session(self.ops, self.mounted.fd, workers=self.workers, readers=self.readers,
                               passthrough=self.passthrough, max_stack_depth=self.max_stack_depth,
                               name=os.path.basename(self.mountpoint) or "fuse", uring=self.uring)
        try:
            self.session.init()
            if self.read_ahead_kib:
                mountinfo.set_read_ahead(self.mountpoint, self.read_ahead_kib)
            self.session.start()
        except BaseException:
            self.mounted.unmount(force=True)
            self.session.close()
            raise
        return self.session

    def stop(self, timeout: float = 10.0, force: bool = False) -> bool:
        """Unmount (lazily; ``force`` also aborts pending requests) and wait up to ``timeout``
        seconds for the workers to end. True when the session ended; False when files are still
        open on the detached mount (the workers keep serving them; descriptors stay open)."""
        if self.mounted is None or self.session is None:
            return True
        self.mounted.unmount(force=force)
        ended = self.session.wait(timeout)
        if ended:
            self.session.close()
        else:
            log.warning("%s: unmounted, but files are still open on it; the session goes on", self.mountpoint)
        return ended

    def __enter__(self) -> "FuseServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
