"""Eviction by next use (Belady's rule) while a plan is active.

Belady's MIN (L. A. Belady, "A study of replacement algorithms for a virtual-storage computer",
IBM Systems Journal 5(2), 1966) evicts the block whose next use is furthest away; it is the best
any cache can do, and a plan tells the future. The disk tier hands its blocks in LRU order to
:func:`next_use_order`, which puts first the blocks no plan needs any more (not in a plan, or
already read), in LRU order, then the planned ones, needed last first.
"""

from __future__ import annotations

from datacache.plan.cursor import PlanCursor

GRACE = 64  # files just behind the position: other processes of the job may still be reading them


def next_use_order(rows, cursors: list[PlanCursor], grace: int = GRACE) -> list[tuple[str, int]]:
    """``rows`` (``(block key, size)`` in LRU order, least recent first) in eviction order.

    A block's distance to its next use is, over ``cursors``, the smallest ``plan position -
    reader position`` of its file version (0 within ``grace`` files behind the position, since
    other readers of the job may still be on them); a block with none (no plan names its
    version, or it was read more than ``grace`` files ago) is never used again. Returns those
    first, in LRU order, then the others by distance, largest first."""
    never, planned = [], []
    for key, size in rows:
        fid = key.split("/", 2)[1] if key.count("/") >= 2 else ""
        distance = None
        for c in cursors:
            at = c.position_of(fid)
            if at is not None and at >= c.position - grace:
                d = max(at - c.position, 0)
                distance = d if distance is None else min(distance, d)
        if distance is None:
            never.append((key, size))
        else:
            planned.append((distance, key, size))
    planned.sort(key=lambda t: -t[0])  # stable: equal distances stay in LRU order
    return never + [(key, size) for _, key, size in planned]
