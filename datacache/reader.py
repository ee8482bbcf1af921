"""Reader: file-like access to one pinned file version, over a block source.

An open file keeps the manifest entry it was opened with (its version), so every byte it returns
belongs to that version even if the UFS or the manifest changes meanwhile (case C3). Reads are cut
into blocks; the block under the cursor is kept so small sequential reads cost a slice. A sequential
pattern triggers read-ahead of the next ``readahead`` blocks through the block source, whose
memory budget is shared by all files: read-ahead past it is skipped, and a file keeps its current
block only while the budget has room, so open files cannot grow memory past it either.
"""

from __future__ import annotations

import io
import threading

from datacache.cache.blocks import block_count
from datacache.manifest import FileEntry


class DatasetFile(io.RawIOBase):
    """A read-only, seekable binary file of ``entry`` (``entry.size`` bytes).

    ``read``/``readinto``/``seek``/``tell`` follow ``io`` semantics: reading at or past EOF returns
    ``b""`` (case C6), seeking past EOF is allowed. ``pread(offset, size)`` reads without moving the
    cursor (used by FUSE). Errors are the block source's ``OSError`` subclasses.
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
        if self.closed:
            raise ValueError("I/O operation on closed file")
        end = min(offset + size, self.entry.size)
        if offset >= end:
            return b""
        first, last = offset // self._bs, (end - 1) // self._bs
        if first == last:
            block = self._block(first)
            return bytes(block[offset - first * self._bs:end - first * self._bs])
        parts = []
        for i in range(first, last + 1):
            block = self._block(i)
            lo = max(offset - i * self._bs, 0)
            hi = min(end - i * self._bs, len(block))
            parts.append(block[lo:hi])
        return b"".join(parts)

    def _block(self, index: int) -> bytes:
        # Read (index, bytes) once: another thread may replace the current block meanwhile.
        cur_index, cur = self._cur_index, self._cur
        if index == cur_index:
            return cur
        block = self._src.get(self.entry, index)
        with self._lock:
            self._keep(index, block)
            self._run = self._run + 1 if index == self._prev + 1 else 0
            self._prev = index
            if self._run == 1:  # a sequential run starts: fill the whole window
                window = range(index + 1, index + 1 + self._readahead)
            elif self._run > 1:  # it goes on: the window slides by one block
                window = range(index + self._readahead, index + self._readahead + 1)
            else:
                window = range(0)
        for ahead in window:
            if ahead < self._nblocks:
                self._src.prefetch(self.entry, ahead)
        return block

    def _keep(self, index: int, block) -> None:
        """Keep ``block`` for the next read if the shared memory budget has room for it, so that
        many open files cannot hold more than the budget between them."""
        budget = self._src.budget
        if self._held:
            budget.release(self._held)
        self._held = len(block) if budget.hold(len(block)) else 0
        self._cur_index, self._cur = (index, block) if self._held else (-1, b"")

    def close(self) -> None:
        with self._lock:
            if self._held:
                self._src.budget.release(self._held)
            self._held, self._cur_index, self._cur = 0, -1, b""
        super().close()
