"""Descriptors of small cache files kept open between reads, as nginx's ``open_file_cache`` keeps them.

Reading one block of a small cached file (a 100 KB JPEG is one block of its one cache file) costs
an ``open`` and a ``close`` around the ``pread``; when the kernel dropped the cache file's dentry
and inode (a dataset larger than RAM, or ``drop_caches``) the ``open`` also reads the directory and
the inode from the device: two reads for one. :class:`OpenFiles` keeps the descriptors of recently
read small files, so a later read of the same file is one ``pread``.

What it must not do is serve bytes of a file that is gone or hold disk space the tier freed:

- a file is only ever replaced under a new name (cache files are named by a fresh token), so a
  kept descriptor names the right file until it is unlinked;
- :meth:`OpenFiles.using` checks ``st_nlink`` (one ``fstat``, no device I/O: the inode is pinned)
  and answers ``FileNotFoundError`` for an unlinked file, closing it once unused: the caller asks
  the index again, as after any eviction;
- a hole punched under a kept descriptor reads as zeros, which fail the block's checksum (the
  caller's check, as for every read);
- space of a file another process evicted is held until the file is next used, dropped from the
  least recently used end, or found unlinked by the sweep that a thread runs every ``SWEEP_S``
  seconds while files are kept (it ran at the next keep only, so an idle reader held evicted
  files until then, as the FUSE daemon's idle passthrough files did: 25-41 MiB of a small device
  for 12 minutes); at most ``max_bytes`` bytes of files are kept open at once, so that is the
  bound on space held past an eviction for ``SWEEP_S``;
- a kept file that grew past ``max_file`` (more of its blocks stored since) is let go at its next
  use or sweep, so the bound counts what the files hold now.
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Iterator

SWEEP_S = 2.0  # seconds between sweeps for files unlinked behind us


def default_limit() -> int:
    """How many descriptors to keep: a quarter of the process's soft ``RLIMIT_NOFILE``, at most
    16,384 and at least 16 (the rest stays for sockets, passthrough backing files and the index)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(16, min(16384, soft // 4))


class _Kept:
    __slots__ = ("fd", "size", "users", "dead")

    def __init__(self, fd: int, size: int):
        self.fd, self.size, self.users, self.dead = fd, size, 0, False


class OpenFiles:
    """Read-only descriptors of files of at most ``max_file`` bytes on the device (at most
    ``limit`` files, ``max_bytes`` bytes of them), least recently used dropped first. Larger
    files are opened per read, as before (one ``open`` is little next to their reads).
    Thread-safe; a descriptor is closed only when no caller uses it."""

    def __init__(self, limit: int | None = None, max_bytes: int = 1 << 30, max_file: int = 4 << 20):
        self.limit = default_limit() if limit is None else limit
        self.max_bytes = max_bytes
        self.max_file = max_file
        self._kept: OrderedDict[str, _Kept] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._sweeper: threading.Thread | None = None  # running while files are kept

    @contextlib.contextmanager
    def using(self, path: str) -> Iterator[int]:
        """A read-only descriptor of ``path`` for the ``with`` block. Raises ``FileNotFoundError``
        when the file is gone (also when a kept descriptor's file was unlinked since) and other
        ``OSError`` from ``open``."""
        kept = self._take(path)
        if kept is None:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                yield fd
            finally:
                self._keep(path, fd)
            return
        try:
            st = os.fstat(kept.fd)
            if st.st_nlink == 0:
                self._forget(path, kept)
                raise FileNotFoundError(2, "cache file unlinked", path)
            if st.st_blocks * 512 > self.max_file:  # grown since it was kept: used this once more
                self._forget(path, kept)
            yield kept.fd
        finally:
            self._give_back(kept)

    def forget(self, path: str) -> None:
        """``path`` is being unlinked or changed by this process: close its descriptor (once unused)."""
        with self._lock:
            kept = self._kept.get(path)
        if kept is not None:
            self._forget(path, kept)

    def close(self) -> None:
        """Close every descriptor (those in use once their user is done) and stop the sweep."""
        self._closed.set()
        with self._lock:
            items = list(self._kept.items())
        for path, kept in items:
            self._forget(path, kept)

    def __len__(self) -> int:
        return len(self._kept)

    # -- inside --------------------------------------------------------------------------------------
    def _take(self, path: str) -> _Kept | None:
        with self._lock:
            kept = self._kept.get(path)
            if kept is not None:
                self._kept.move_to_end(path)
                kept.users += 1
            return kept

    def _give_back(self, kept: _Kept) -> None:
        with self._lock:
            kept.users -= 1
            close = kept.dead and kept.users == 0
        if close:
            os.close(kept.fd)

    def _keep(self, path: str, fd: int) -> None:
        """Keep ``fd`` (just used for ``path``) unless ``path`` is kept already or too big."""
        try:
            size = os.fstat(fd).st_blocks * 512
        except OSError:
            size = self.max_file + 1
        closing = [fd]
        with self._lock:
            if path not in self._kept and size <= self.max_file and not self._closed.is_set():
                self._kept[path] = _Kept(fd, size)
                self._bytes += size
                closing = self._trim()
                if self._sweeper is None:
                    self._sweeper = threading.Thread(target=self._sweep_while_kept, daemon=True,
                                                     name="datacache-openfiles-sweep")
                    self._sweeper.start()
        for f in closing:
            os.close(f)

    def _trim(self) -> list[int]:
        """Drop least recently used files past the bounds; their descriptors to close (the unused)."""
        closing = []
        while self._kept and (len(self._kept) > self.limit or self._bytes > self.max_bytes):
            path, kept = self._kept.popitem(last=False)
            closing += self._drop(kept)
        return closing

    def _drop(self, kept: _Kept) -> list[int]:
        """Under the lock: ``kept`` leaves the table; its descriptor when nobody uses it."""
        if kept.dead:
            return []
        kept.dead = True
        self._bytes -= kept.size
        return [kept.fd] if kept.users == 0 else []

    def _forget(self, path: str, kept: _Kept) -> None:
        with self._lock:
            if self._kept.get(path) is kept:
                del self._kept[path]
            closing = self._drop(kept)
        for f in closing:
            os.close(f)

    def _sweep_while_kept(self) -> None:
        """The sweep thread: every ``SWEEP_S`` seconds, let go of kept files unlinked behind us or
        grown past ``max_file``; ends when none is kept (the next keep starts another) or at close."""
        while not self._closed.wait(SWEEP_S):
            with self._lock:
                items = list(self._kept.items())
                if not items:
                    self._sweeper = None
                    return
            for path, kept in items:
                with contextlib.suppress(OSError):
                    st = os.fstat(kept.fd)
                    if not kept.dead and (st.st_nlink == 0 or st.st_blocks * 512 > self.max_file):
                        self._forget(path, kept)
