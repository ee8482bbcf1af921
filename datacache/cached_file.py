"""CachedFile: a complete cached file version as a buffered local file, with zero-copy reads.

``datacache://`` opens a version held whole in the cache (:meth:`DatasetClient.local_file`) as a
plain local file, so ``read`` costs what it costs on the local disk. A reader can do better than a
copy when it accepts a buffer: pyarrow's Python-file adapter calls ``read_buffer(n)`` when the
file has it and wraps what it gets without copying (``arrow/python/io.cc``, ``PyReadableFile::Read``),
so here Parquet's footer and column chunks are read as views of a read-only ``mmap`` of the cache
file instead of copies (a random row group of the benchmarks' Parquet files, one process: 190-200
row groups/s against 170-180 through ``read``; fsspec's ``blockcache``, which copies out of its own
``mmap``, reads as ``read`` does. In the 4-process benchmark, where decoding dominates: 1.00-1.04x
fsspec's caches; 2026-12-06).

Why the mapping is safe: the cache never truncates a file it handed out whole or punches holes in
it; it evicts it by ``unlink`` (:meth:`DiskTier.open_whole`, :mod:`datacache.cache.filetier`), and
the mapping keeps the unlinked file's bytes, as an open descriptor does. A file truncated behind the
cache's back (by another program) would raise SIGBUS on a mapped read; ``read`` would return short.
"""

from __future__ import annotations

import io
import mmap

MAP_MIN = 1 << 20  # bytes: smaller files answer read_buffer with a copy (mapping costs more than it saves)


class CachedFile(io.BufferedReader):
    """``io.BufferedReader`` over the read-only descriptor ``fd`` (owned: closed with the file)
    of a complete local file of ``size`` bytes, plus :meth:`read_buffer`. ``name``: what ``name``
    reports (the dataset path). Errors are ``io``'s: ``ValueError`` on a closed file, ``OSError``
    from the device."""

    def __init__(self, fd: int, name: str, size: int):
        super().__init__(io.FileIO(fd, "rb", closefd=True))
        self._name = name
        self._size = size
        self._map: mmap.mmap | None = None

    @property
    def name(self) -> str:
        return self._name

    def read_buffer(self, size: int = -1) -> bytes | memoryview:
        """Up to ``size`` bytes at the position (all to EOF when negative), the position moved past
        them: for a file of at least :data:`MAP_MIN` bytes a read-only ``memoryview`` of a mapping
        of the file (no copy; it stays valid after :meth:`close`), else ``bytes``."""
        if self._map is None:
            if self._size < MAP_MIN:
                return self.read(size)
            self._map = mmap.mmap(self.fileno(), 0, prot=mmap.PROT_READ)
        pos = self.tell()
        end = len(self._map) if size is None or size < 0 else min(pos + size, len(self._map))
        end = max(end, pos)  # a position past EOF reads nothing
        self.seek(end)
        return memoryview(self._map)[pos:end]

    def close(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # views of it are still held: the mapping goes with the last one
                pass
            self._map = None
        super().close()
