"""Reader: file-like access to one pinned file version, over a block source.

An open file keeps the manifest entry it was opened with (its version), so every byte it returns
belongs to that version even if the UFS or the manifest changes meanwhile (case C3). Reads are cut
into blocks; the block under the cursor is kept so small sequential reads cost a slice. A sequential
pattern triggers read-ahead of the next ``readahead`` blocks through the block source, whose
memory budget is shared by all files: read-ahead past it is skipped, and a file keeps its current
block only while the budget has room, so open files cannot grow memory past it either.

A sequential reader also loads the next ``AHEAD_BLOCKS`` blocks into memory in the background
while the current one is served, so the read that crosses into one finds it ready (loading a 4 MiB
block from the SSD tier - read, checksum - costs about a millisecond that would otherwise stall
every block boundary; two loads at once keep a reader that copies faster than one load delivers
busy). Those loads, and the read-ahead hints, go through the source's
:class:`~datacache.cache.readahead.ReadAhead`: its load pool runs them (a load may wait for a fill
the hints started, which runs in its fill pool), its buffer keeps the loaded blocks under this
file's keys. They are data kept between reads, like the current block: held against the same
budget (``hold``: only while half the budget stays free for fills, so they never starve a demand
read; skipped otherwise) until a block becomes the current block or is dropped.
"""

from __future__ import annotations

import functools
import io
import operator
import threading
from collections import deque

from datacache.cache.blocks import block_count, block_slice
from datacache.manifest import FileEntry

AHEAD_BLOCKS = 2  # blocks a sequential reader has loading in the background at once


class DatasetFile(io.RawIOBase):
    """A read-only, seekable binary file of ``entry`` (``entry.size`` bytes).

    ``read``/``readinto``/``seek``/``tell`` follow ``io`` semantics: reading at or past EOF returns
    ``b""`` (case C6), seeking past EOF is allowed. ``pread(offset, size)`` reads without moving the
    cursor (used by FUSE). Errors are the block source's ``OSError`` subclasses. ``readahead``:
    blocks read ahead on sequential reads (0: none, and no blocks loaded ahead either).
    """

    def __init__(self, entry: FileEntry, source, readahead: int = 4):
        super().__init__()
        self.entry = entry
        self.name = entry.path
        self._src = source
        self._bs = source.block_size
        self._nblocks = block_count(entry.size, self._bs)
        self._readahead = readahead
        self._pos = 0
        self._cur_index, self._cur = -1, b""  # the block kept for the next small read
        self._held = 0  # bytes of it counted against the source's memory budget
        self._prev, self._run = -1, 0  # last block index read; length of the sequential run
        self._lock = threading.Lock()
        self._ra = source.readahead
        self._token = object()  # this file's keys in the read-ahead buffer: (token, index)
        self._ahead: deque[int] = deque()  # the next blocks, loading into that buffer, consecutive

    @property
    def size(self) -> int:
        return self.entry.size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        offset = operator.index(offset)  # TypeError for a float, as io.FileIO
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self.entry.size + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if pos < 0:
            raise OSError(22, "negative seek position", self.name)
        self._pos = pos
        return pos

    def readinto(self, buffer) -> int:
        data = self.pread(self._pos, len(buffer))
        n = len(data)
        memoryview(buffer).cast("B")[:n] = data
        self._pos += n
        return n

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = max(self.entry.size - self._pos, 0)
        data = self.pread(self._pos, size)
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def pread(self, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``offset``; short only at EOF, ``b""`` at or past it."""
        return bytes(self.view(offset, size))

    def view(self, offset: int, size: int) -> bytes | memoryview:
        """As :meth:`pread`, but a range inside one block comes back as a read-only view of the
        block, not a copy (FUSE replies from any buffer: one copy of a 1 MiB request less)."""
        if self.closed:
            raise ValueError("I/O operation on closed file")
        end = min(offset + size, self.entry.size)
        if offset >= end:
            return b""
        first, last = offset // self._bs, (end - 1) // self._bs
        if first == last:
            block = self._block(first)
            lo, hi = offset - first * self._bs, end - first * self._bs
            if lo == 0 and hi == len(block) and isinstance(block, bytes):
                return block  # a whole small file: pread's bytes() of it is then no copy either
            return block_slice(block, lo, hi)
        parts = []
        for i in range(first, last + 1):
            block = self._block(i)
            lo = max(offset - i * self._bs, 0)
            hi = min(end - i * self._bs, len(block))
            parts.append(block_slice(block, lo, hi))
        return b"".join(parts)

    def holds(self, index: int) -> bool:
        """True when block ``index`` is in memory (a read of it costs a slice, no I/O)."""
        if index == self._cur_index:
            return True
        return index in self._ahead and self._ra.ready((self._token, index))

    def _block(self, index: int) -> bytes:
        # Read (index, bytes) once: another thread may replace the current block meanwhile.
        cur_index, cur = self._cur_index, self._cur
        if index == cur_index:
            return cur
        with self._lock:  # threads sharing one open file (pread) must not lose loads ahead
            ahead = self._take_ahead(index)
        # A block loaded ahead comes held against the budget; None when its load failed (an
        # outage since over is not replayed: the block is read here) or was dropped.
        block = self._ra.take((self._token, index), release=False) if ahead else None
        held = block is not None
        if not held:
            block = self._src.get(self.entry, index, pieces=True)
        with self._lock:
            self._keep(index, block, held)
            self._run = self._run + 1 if index == self._prev + 1 else 0
            self._prev = index
            if self._run == 1:  # a sequential run starts: fill the whole window
                window = range(index + 1, min(index + 1 + self._readahead, self._nblocks))
            elif self._run > 1:  # it goes on: the window slides by one block
                window = range(index + self._readahead, min(index + self._readahead + 1, self._nblocks))
            else:
                window = range(0)
            if self._readahead and self._run and index + 1 < self._nblocks:
                self._load_next(index, window)
        return block

    def _load_next(self, index: int, window: range) -> None:
        """Have blocks ``index + 1 .. index + AHEAD_BLOCKS`` loading ahead (as far as the budget
        holds them); the hints for the rest of ``window`` go with the first new load (or alone),
        never on the caller's thread. A block being loaded gets no hint: a remote source would
        fetch it twice when the hint landed after the load had looked for it. Called holding
        ``_lock``."""
        last = index + AHEAD_BLOCKS
        hints = range(max(window.start, last + 1), window.stop)
        first = self._ahead[-1] + 1 if self._ahead else index + 1  # loads ahead are consecutive
        for i in range(first, min(last + 1, self._nblocks)):
            n = min(self._bs, self.entry.size - i * self._bs)
            load = functools.partial(self._load_ahead, i, hints)
            if not self._ra.keep((self._token, i), n, load, waits=True):
                break  # no room in the budget: read on demand
            self._ahead.append(i)
            hints = range(0)
        if hints:
            self._ra.later(self._prefetch, hints)

    def _prefetch(self, window) -> None:
        for i in window:
            self._src.prefetch(self.entry, i)

    def _load_ahead(self, index: int, window):
        """In the load pool: the read-ahead hints, then block ``index``."""
        self._prefetch(window)
        return self._src.get(self.entry, index, pieces=True)

    def _take_ahead(self, index: int) -> bool:
        """Whether block ``index`` is loading ahead (:meth:`ReadAhead.take` waits for it outside);
        called holding ``_lock``. The blocks loading past it stay; any other is dropped (all of
        them when ``index`` is not among them: the reader left the run)."""
        if self._ahead and self._ahead[0] == index:  # the next block of a sequential run
            self._ahead.popleft()
            return True
        ahead, self._ahead = self._ahead, deque()
        hit = index in ahead
        for i in ahead:
            if hit and i > index:
                self._ahead.append(i)
            elif i != index:
                self._ra.drop((self._token, i))
        return hit

    def _keep(self, index: int, block, held: bool) -> None:
        """Keep ``block`` for the next read if it is ``held`` against the shared memory budget
        already (loaded ahead) or the budget has room for it, so that many open files cannot hold
        more than the budget between them."""
        budget = self._ra.budget
        if self._held:
            budget.release(self._held)
        self._held = len(block) if held or budget.hold(len(block)) else 0
        self._cur_index, self._cur = (index, block) if self._held else (-1, b"")

    def close(self) -> None:
        with self._lock:
            ahead, self._ahead = self._ahead, deque()
            for i in ahead:
                self._ra.drop((self._token, i))
            if self._held:
                self._ra.budget.release(self._held)
            self._held, self._cur_index, self._cur = 0, -1, b""
        super().close()

