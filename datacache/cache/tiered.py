"""Tiered store: MEM over SSD/HDD, as in Fluid's ``tieredstore.levels``.

Policy (stated once, here):

| event            | what happens                                                          |
|------------------|-----------------------------------------------------------------------|
| put              | written to the first disk level (SSD, else HDD); MEM only if alone    |
| get, MEM hit     | served from MEM                                                       |
| get, disk hit    | verified by checksum and served; promoted to MEM on its second access |
| level past high  | LRU blocks of that level go until it is at its low watermark          |
| only MEM level   | MEM is the cache; blocks are lost when the process ends               |

Promotion on the second access (as in 2Q / Linux's active list) keeps MEM scan-resistant: one
sequential pass over a file larger than MEM would otherwise evict every hot block for blocks never
read again. Blocks evicted from SSD are dropped, not demoted to HDD: a block is cheaper to refetch
from the UFS than to copy between local media on the read path.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from datacache.cache.blocks import PieceBlock
from datacache.cache.disk import DiskTier
from datacache.cache.memory import MemoryTier


_GHOSTS = 1 << 16  # keys remembered as "seen once" (about 100 bytes each)


@dataclass(frozen=True)
class LevelUsage:
    """One level's ``medium``, ``path`` ('' for MEM), ``quota`` and ``used`` in bytes."""

    medium: str
    path: str
    quota: int
    used: int


class TieredStore:
    """Blocks by key (``str(BlockKey)``) over ``levels`` ordered fastest first (MEM, SSD, HDD)."""

    def __init__(self, levels: list[MemoryTier | DiskTier]):
        if not levels:
            raise ValueError("a tiered store needs at least one level")
        self.levels = levels
        self._mem = next((lv for lv in levels if isinstance(lv, MemoryTier)), None)
        self._disk = next((lv for lv in levels if isinstance(lv, DiskTier)), None)
        self._seen_once: OrderedDict[str, None] = OrderedDict()  # disk hits not yet promoted
        self._lock = threading.Lock()

    def rank_victims_by(self, ranking) -> None:
        """Evict from every disk level in the order ``ranking(rows)`` gives (see
        :attr:`DiskTier.rank_victims`; None: LRU). MEM levels keep LRU."""
        for level in self.levels:
            if isinstance(level, DiskTier):
                level.rank_victims = ranking

    def get(self, key: str, pieces: bool = False) -> bytes | memoryview | PieceBlock | None:
        """The block's bytes from the fastest level holding it, or None; with ``pieces`` a block
        may come as a :class:`PieceBlock` (read from disk by :meth:`DiskTier.get_pieces`, or kept
        so in MEM), else a MEM-held one is joined (a copy)."""
        if self._mem is not None:
            data = self._mem.get(key)
            if data is not None:
                return bytes(data) if not pieces and isinstance(data, PieceBlock) else data
        if self._disk is not None:
            data = self._disk.get_pieces(key) if pieces else self._disk.get(key)
            if data is not None and self._mem is not None and self._second_access(key):
                self._mem.put(key, data)
            return data
        return None

    def _second_access(self, key: str) -> bool:
        with self._lock:
            if self._seen_once.pop(key, False) is None:
                return True
            self._seen_once[key] = None
            if len(self._seen_once) > _GHOSTS:
                self._seen_once.popitem(last=False)
            return False

    def __contains__(self, key: str) -> bool:
        """Whether a level holds the block (on disk: its file is there at its size, see
        :meth:`DiskTier.__contains__`)."""
        return any(key in lv for lv in self.levels)

    def verify(self, key: str) -> bool:
        """Whether the block is held with bytes that pass their checksum (a disk block is read
        whole, and dropped if it fails); not a use of the block (no promotion to MEM)."""
        if self._disk is not None:
            return self._disk.verify(key)
        return key in self._mem

    def check(self, key: str) -> bool | None:
        """The scrub of one block (``datacache verify``): None when no level holds it, else
        :meth:`verify` (read, checked, dropped when it fails)."""
        return self.verify(key) if key in self else None

    def put(self, key: str, data: bytes, bulk: bool = False) -> bool:
        """Store a block; False when no level could keep it (larger than every level's quota).
        ``bulk``: a warmup's load, written around the page cache (see :meth:`DiskTier.put`)."""
        if self._disk is not None:
            return self._disk.put(key, data, bulk)
        return self._mem.put(key, bytes(data))

    def advise(self, key: str) -> bool:
        """True when the block is cached; a block on disk is also read ahead by the kernel."""
        if self._mem is not None and key in self._mem:
            return True
        return self._disk is not None and self._disk.advise(key)

    @property
    def directory(self) -> str | None:
        """The disk level's cache directory, shared with other processes; None for MEM only."""
        return self._disk.path if self._disk is not None else None

    def block_file(self, key: str) -> str | None:
        """Path of a block's file on the disk level, for short-circuit reads; None if not on disk."""
        return self._disk.block_file(key) if self._disk is not None else None

    def open_whole(self, file: str, size: int, blocks: int) -> int | None:
        """A read-only descriptor of the disk level's cache file of ``file`` (``dataset/file_id``)
        when all its ``blocks`` blocks (``size`` bytes) are stored there, else None (see
        :meth:`DiskTier.open_whole`). The caller closes it."""
        return self._disk.open_whole(file, size, blocks) if self._disk is not None else None

    def delete_prefix(self, prefix: str) -> int:
        """Drop every block whose key starts with ``prefix`` from every level; returns the count."""
        return max(lv.delete_prefix(prefix) for lv in self.levels)

    @property
    def capacity(self) -> int:
        """Bytes the store can hold: the capacity of the level blocks are written to (the first disk
        level, its quota or less on a smaller device, see :meth:`DiskTier.capacity`; MEM's quota
        only when it is alone). MEM holds copies of hot disk blocks, so it adds none."""
        return self._home.capacity()

    def used(self) -> int:
        """Bytes held by the level blocks are written to (see :attr:`capacity`)."""
        return self._home.used()

    @property
    def _home(self) -> MemoryTier | DiskTier:
        return self._disk if self._disk is not None else self._mem

    def usage(self) -> list[LevelUsage]:
        """Per-level quota and use."""
        return [LevelUsage(lv.medium, getattr(lv, "path", ""), lv.quota, lv.used()) for lv in self.levels]

    def close(self) -> None:
        for lv in self.levels:
            lv.close()
