"""The in-process block source: blocks by (file version, index), from the tiered store or filled
from the UFS.

It keeps the block-source contract (:class:`~datacache.cache.blocksource.BlockSource`) that the
Reader, DatasetClient and warmup use; the runtime's cache workers keep it too
(``datacache.cluster.worker_source``). Fills are single-flight: concurrent requests of one missing
block share one UFS read, threads of a process through the single-flight of the source's
:class:`~datacache.cache.readahead.ReadAhead` (whose fill pool also runs fills ahead: the store
keeps what they load, where the read finds it), processes sharing the cache directory through a
per-block file lock (:mod:`datacache.cache.filllock`; a waiter re-checks the cache and reads the
block filled meanwhile). Bytes the UFS cannot prove to be one version
(:class:`~datacache.entry.Unproven`) are returned to a demand read but never stored. Every fill
holds its bytes against one shared :class:`~datacache.cache.budget.MemoryBudget`, taken before the
file lock, so read-ahead and warmup cannot grow memory past it and no process waits for memory
holding a lock.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
from concurrent.futures import Future

from datacache.cache.blocks import BlockKey, PieceBlock, block_count, block_range, file_id
from datacache.cache.disk import DEVICE_FULL
from datacache.cache.filllock import FillLocks
from datacache.cache.readahead import ReadAhead
from datacache.cache.stats import HitStats
from datacache.cache.tiered import TieredStore
from datacache.entry import Unproven
from datacache.errors import StaleFileError
from datacache.manifest import FileEntry

log = logging.getLogger(__name__)
FILL_COPIES = 2
"""A warmup span is held twice at its peak: a network read (aiohttp, botocore) joins the body's
chunks into one bytes object at its end, and storing copies each block out of the span."""


class LocalBlockSource:
    """Blocks of dataset ``dataset`` cut at ``block_size`` bytes.

    ``store``: the tiered store; ``ufs``: a ``UnionNamespace`` (its ``read`` gives exact-version
    bytes); ``readahead``: the read-ahead component (memory budget, single-flight, fill pool:
    read-ahead fills run there, demand fills in the caller's thread), which this source closes;
    ``stats``: hit counters (or None). UFS errors propagate unchanged (StaleFileError,
    FileNotFoundError, UFSUnavailableError).
    """

    def __init__(self, dataset: str, store: TieredStore, ufs, block_size: int, readahead: ReadAhead,
                 stats: HitStats | None = None):
        self.dataset = dataset
        self.store = store
        self.ufs = ufs
        self.block_size = block_size
        self.readahead = readahead
        self.stats = stats
        self._fill_locks = FillLocks(store.directory) if store.directory is not None else None
        self.ufs_bytes = 0

    def key(self, entry: FileEntry, index: int) -> BlockKey:
        return BlockKey(self.dataset, file_id(entry.mount, entry.ufs_path, entry.version, self.block_size), index)

    def local_file(self, entry: FileEntry) -> int | None:
        """A read-only descriptor of ``entry``'s version as one contiguous local file, which the
        caller owns and closes: the disk level's own cache file of the version when all its blocks
        are stored there (checked block by block at its first hand-out, see
        :meth:`DiskTier.open_whole`), else None. Reads of it reach no block source: a one-block
        version counts the hit its block read would have, a longer one none (a reader of a row
        group or a passthrough open may read a little of it)."""
        key = self.key(entry, 0)
        blocks = block_count(entry.size, self.block_size)
        fd = self.store.open_whole(f"{key.dataset}/{key.file_id}", entry.size, blocks)
        if fd is not None and blocks == 1 and self.stats is not None:
            self.stats.count(self.dataset, True)
        return fd

    def is_cached(self, entry: FileEntry, index: int) -> bool:
        return str(self.key(entry, index)) in self.store

    def get(self, entry: FileEntry, index: int, pieces: bool = False) -> bytes | memoryview | PieceBlock:
        """Block ``index`` of ``entry`` (short only for the last block); a bytes-like object to
        slice, or with ``pieces`` possibly a :class:`PieceBlock` (see :meth:`TieredStore.get`).
        Counts a hit or a miss."""
        key = str(self.key(entry, index))
        data = self.store.get(key, pieces=pieces)
        if self.stats is not None:
            self.stats.count(self.dataset, data is not None)
        if data is not None:
            return data
        return self._load(key, entry, index, wait=True).result()

    def prefetch(self, entry: FileEntry, index: int) -> None:
        """Prepare a block for an upcoming read: a cached one is read ahead by the kernel, a missing
        one is filled in the background if the memory budget allows (else skipped)."""
        if index >= block_count(entry.size, self.block_size):
            return
        key = str(self.key(entry, index))
        if not self.store.advise(key):  # cached blocks are only read ahead by the kernel
            self._load(key, entry, index, wait=False)

    def verify(self, entry: FileEntry) -> list[tuple[int, bool]]:
        """The scrub of ``entry``'s version (``datacache verify``): every stored block is read and
        checked against its recorded checksum (the check ``fill`` makes with ``check``); returns
        ``(index, passed)`` per block checked. A block that fails is dropped (the next read
        refetches it); blocks dropped with it (a cache file handed out whole goes whole) are not
        checked."""
        fid = self.key(entry, 0).file_id
        found = ((i, self.store.check(str(BlockKey(self.dataset, fid, i))))
                 for i in range(block_count(entry.size, self.block_size)))
        return [(i, ok) for i, ok in found if ok is not None]

    def fill(self, entry: FileEntry, first: int, last: int, check: bool = False, bulk: bool = False) -> int:
        """Warmup: make blocks ``first..last`` (inclusive) cached with one UFS read of the missing
        span. A block counts as cached when its file is there at its size, or with ``check`` when
        its bytes pass their checksum (each is read; ``juicefs warmup --check``); a missing or
        damaged one is loaded again. ``bulk``: a warmup's load, stored around the page cache
        (see :meth:`TieredStore.put`); a plan's fill, read soon, is not. Returns the bytes newly
        stored; raises the UFS's error, ``OSError(ENOSPC)`` when the store cannot keep a block, or
        ``OSError(EBUSY)`` when the bytes cannot be proven one version (another process has the
        local file open for writing).
        Holds ``FILL_COPIES`` times the span's bytes against the memory budget while it runs."""
        fid = self.key(entry, first).file_id  # one hash per call, not one per block and look-up
        keys = {i: str(BlockKey(self.dataset, fid, i)) for i in range(first, last + 1)}
        held = self.store.verify if check else self.store.__contains__
        missing = [i for i in keys if not held(keys[i])]
        if not missing:
            return 0
        start = block_range(missing[0], entry.size, self.block_size)[0]
        end = block_range(missing[-1], entry.size, self.block_size)[1]
        held = FILL_COPIES * (end - start)
        budget = self.readahead.budget
        budget.acquire(held)  # before the locks: never wait for memory holding one
        try:
            with self._locked([keys[i] for i in missing]):
                # another process may have filled some while this one waited for the locks
                missing = [i for i in missing if keys[i] not in self.store]
                return self._fill_span(entry, missing, keys, bulk) if missing else 0
        finally:
            budget.release(held)

    def _fill_span(self, entry: FileEntry, missing: list[int], keys: dict[int, str], bulk: bool) -> int:
        """Store blocks ``missing`` (ascending) from one UFS read of their span; bytes stored.
        ``keys``: the cache key of each block index; ``bulk``: see :meth:`fill`."""
        start = block_range(missing[0], entry.size, self.block_size)[0]
        end = block_range(missing[-1], entry.size, self.block_size)[1]
        data = self._read_ufs(entry, start, end)
        if isinstance(data, Unproven):
            raise OSError(errno.EBUSY, "another process has the file open for writing: it is cached once it is "
                                       "closed (warm it up again then)", entry.path)
        stored, view = 0, memoryview(data)  # blocks as views of the read: no copy of each
        for i in missing:
            b0, b1 = block_range(i, entry.size, self.block_size)
            full_before = full_bypasses(self.store)
            if not self.store.put(keys[i], view[b0 - start:b1 - start], bulk):
                raise OSError(errno.ENOSPC, _not_kept(self.store, b1 - b0, full_before), entry.path)
            stored += b1 - b0
        return stored

    def _load(self, key: str, entry: FileEntry, index: int, wait: bool) -> Future | None:
        """Block ``index`` filled through the read-ahead's single-flight (see :meth:`ReadAhead.load`)."""
        start, end = block_range(index, entry.size, self.block_size)
        return self.readahead.load(key, end - start, functools.partial(self._fill_one, key, entry, index), wait)

    def _fill_one(self, key: str, entry: FileEntry, index: int) -> bytes:
        with self._locked([key]):
            data = self.store.get(key)  # filled by another process while this one waited
            if data is None:
                data = self.uncached(entry, index)
                if not isinstance(data, Unproven):  # returned, never kept
                    self.store.put(key, data)  # a block that cannot be kept is still returned
        return data

    def uncached(self, entry: FileEntry, index: int) -> bytes:
        """Block ``index`` of ``entry`` read from the UFS, not stored (a draining worker serves
        blocks it must not keep). Raises as the UFS does (StaleFileError also for a short read)."""
        start, end = block_range(index, entry.size, self.block_size)
        return self._read_ufs(entry, start, end)

    @contextlib.contextmanager
    def _locked(self, keys: list[str]):
        """Hold the cross-process fill locks of ``keys``: none for a MEM-only store, whose blocks
        no other process sees, nor (after one warning) when the lock files cannot be made."""
        with contextlib.ExitStack() as stack:
            if self._fill_locks is not None:
                try:
                    stack.enter_context(self._fill_locks.held(keys))
                except OSError as err:
                    log.warning("cache %s: no fill locks (%s): processes may each fetch a block the cache lacks",
                                self.store.directory, err)
                    self._fill_locks = None
            yield

    def _read_ufs(self, entry: FileEntry, start: int, end: int) -> bytes:
        data = self.ufs.read(entry.mount, entry.ufs_path, entry.version, start, end)
        self.ufs_bytes += len(data)
        if len(data) != end - start:
            raise StaleFileError(entry.path, f"the UFS returned {len(data)} bytes for [{start}, {end}) "
                                             f"of a {entry.size}-byte file: it changed size")
        return data

    def hit_counts(self) -> tuple[int, int]:
        """``(hits, misses)`` of this dataset's block reads, over every process sharing the cache."""
        return self.stats.get(self.dataset) if self.stats is not None else (0, 0)

    def usage(self) -> tuple[int, int]:
        """``(used, capacity)`` bytes of the store's level blocks are written to (its first disk level)."""
        return self.store.used(), self.store.capacity

    def worker_progress(self) -> dict[str, dict[str, int]]:
        """No cache workers: ``{}``."""
        return {}

    def close(self) -> None:
        """Stop read-ahead, then close the store and counters this source owns."""
        self.readahead.close()
        if self.stats is not None:
            self.stats.close()
        self.store.close()


def full_bypasses(store) -> int:
    """Writes of ``store``'s levels (a TieredStore; 0 for None or a store of no levels) that met a
    full device so far."""
    return sum(getattr(level, "full_bypasses", 0) for level in getattr(store, "levels", ()))


def _not_kept(store, size: int, full_before: int) -> str:
    """Why ``store`` (a TieredStore) just refused a block of ``size`` bytes: a level that is
    unhealthy (a write error), a device that filled before the quota (``full_bypasses`` grew past
    ``full_before``), else the quota itself."""
    for level in store.levels:
        if not getattr(level, "healthy", True):
            return (f"the cache tier {level.path} ({level.medium}) is unhealthy: {level.last_error}; writes are "
                    "tried again after a while")
    if full_bypasses(store) > full_before:
        return DEVICE_FULL
    return f"a block of {size} bytes does not fit in the cache quota: raise tieredstore.levels[].quota"
