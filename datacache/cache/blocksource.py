"""The block-source contract: what the Reader, DatasetClient, warmup and FUSE ask of a source.

Two implementations keep it: :class:`~datacache.cache.local_source.LocalBlockSource` (this process's
tiered store, filled from the UFS) and :class:`~datacache.cluster.worker_source.ClusterBlockSource` (the
runtime's cache workers). ``tests/cluster/test_block_source_contract.py`` runs both through the same
cases: hits, misses, single-flight, budget bounds, read-ahead (a block loaded ahead is served
without a second fetch; an abandoned one gives its memory back; loads ahead never deadlock), a
version change, a corrupt block, and (for workers) a dead worker.

Blocks are addressed by a file version (a :class:`~datacache.entry.FileEntry`) and an index;
block ``i`` covers bytes ``[i * block_size, min((i + 1) * block_size, size))``. Errors are
``OSError`` subclasses carrying an errno, raised unchanged from the UFS: ``FileNotFoundError``
(ENOENT), :class:`~datacache.errors.StaleFileError` (ESTALE: the file is no longer at that version
and the block is not cached), :class:`~datacache.errors.UFSUnavailableError` (EIO). A source never
returns bytes of another version, never a block whose checksum failed, and never raises a cache
worker's own failure (a dead worker is a slower read).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from datacache.cache.blocks import BlockKey, PieceBlock
from datacache.cache.readahead import ReadAhead
from datacache.entry import FileEntry


@runtime_checkable
class BlockSource(Protocol):
    """Blocks of one dataset's file versions, cut at ``block_size`` bytes.

    ``readahead``: the component its background loads go through (fills, fetched blocks kept
    until read, a Reader's loads of its next blocks); its ``budget`` is the memory budget (bytes)
    fills and read-ahead hold against, and readers hold the blocks they keep between reads against
    the same one, so every open file of a process together stays within it. ``ufs_bytes``: bytes
    read from the UFS on this source's behalf so far.
    """

    block_size: int
    readahead: ReadAhead

    @property
    def ufs_bytes(self) -> int: ...

    def key(self, entry: FileEntry, index: int) -> BlockKey:
        """The cache key of block ``index`` of ``entry``'s version."""

    def get(self, entry: FileEntry, index: int, pieces: bool = False) -> bytes | memoryview | PieceBlock:
        """Block ``index`` (bytes-like, short only for the last block; with ``pieces``, possibly
        a :class:`PieceBlock` of 1 MiB pieces), from the cache or filled from the UFS. Concurrent
        calls for one missing block share one UFS read. Counts a hit or a miss."""

    def prefetch(self, entry: FileEntry, index: int) -> None:
        """Start loading block ``index`` in the background through ``readahead`` if the budget
        allows; else nothing. A later :meth:`get` of it makes no second UFS or worker fetch."""

    def fill(self, entry: FileEntry, first: int, last: int, check: bool = False, bulk: bool = False) -> int:
        """Warmup: make blocks ``first..last`` (inclusive) cached; returns the bytes newly stored
        (0 when all were). A block counts as cached when its file is there at its size; with
        ``check`` only when its bytes also pass their checksum (missing or damaged blocks are
        loaded again). ``bulk``: a warmup's load, written around the page cache (``O_DIRECT``)
        where the cache's file system allows; a fill that a reader follows soon passes False.
        Raises the UFS's error, or ``OSError(ENOSPC)`` when the cache cannot keep a block."""

    def verify(self, entry: FileEntry) -> list[tuple[int, bool]]:
        """The scrub (``datacache verify``): every stored copy of the version's blocks is read and
        checked against its recorded checksum, a failing one dropped (the next read refetches it);
        ``(index, passed)`` per copy checked. Fetches nothing."""

    def is_cached(self, entry: FileEntry, index: int) -> bool:
        """Whether block ``index`` is held where a read finds it (on disk: its file is there at
        its size, not only named by the cache's index)."""

    def usage(self) -> tuple[int, int]:
        """``(used, capacity)`` bytes of the cache level blocks are written to."""

    def hit_counts(self) -> tuple[int, int]:
        """``(hits, misses)`` of this dataset's block reads, over every process sharing them."""

    def worker_progress(self) -> dict[str, dict[str, int]]:
        """Bytes and blocks stored per cache worker by this source's fills (``{}`` in-process)."""

    def close(self) -> None:
        """Stop background loads and release what the source owns."""
