"""MEM tier: a bounded LRU of blocks inside one process.

Eviction follows Fluid/Alluxio's tiered store: when a put would take the tier past
``high * quota`` bytes, least recently used blocks go until it is at or below ``low * quota``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from datacache.cache.blocks import PieceBlock


class MemoryTier:
    """LRU of blocks (``bytes``, or a :class:`PieceBlock` as a reader got it from disk: kept as
    is, no copy), bounded by ``quota`` bytes (watermarks ``high``/``low`` in (0, 1])."""

    medium = "MEM"

    def __init__(self, quota: int, high: float = 0.95, low: float = 0.7):
        self.quota = quota
        self._high = int(quota * high)
        self._low = int(quota * low)
        self._blocks: OrderedDict[str, bytes | PieceBlock] = OrderedDict()
        self._used = 0
        self._lock = threading.Lock()
        self.evictions = 0

    def get(self, key: str) -> bytes | PieceBlock | None:
        with self._lock:
            data = self._blocks.get(key)
            if data is not None:
                self._blocks.move_to_end(key)
            return data

    def __contains__(self, key: str) -> bool:
        return key in self._blocks

    def put(self, key: str, data: bytes | memoryview | PieceBlock) -> bool:
        """Store a block; returns False (storing nothing) when it is larger than the high mark."""
        size = len(data)
        if size > self._high:
            return False
        with self._lock:
            if key in self._blocks:
                self._blocks.move_to_end(key)
                return True
            if self._used + size > self._high:
                while self._blocks and self._used + size > self._low:
                    _, old = self._blocks.popitem(last=False)
                    self._used -= len(old)
                    self.evictions += 1
            self._blocks[key] = data if isinstance(data, PieceBlock) else bytes(data)
            self._used += size
            return True

    def delete_prefix(self, prefix: str) -> int:
        """Drop every block whose key starts with ``prefix``; returns how many."""
        with self._lock:
            doomed = [k for k in self._blocks if k.startswith(prefix)]
            for k in doomed:
                self._used -= len(self._blocks.pop(k))
            return len(doomed)

    def used(self) -> int:
        """Bytes held."""
        return self._used

    def capacity(self) -> int:
        """Bytes it can hold: its quota (memory is not checked against the machine's free RAM)."""
        return self.quota

    def close(self) -> None:
        with self._lock:
            self._blocks.clear()
            self._used = 0
