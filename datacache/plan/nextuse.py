"""Eviction by next use (Belady's rule) while a plan is active.

Belady's MIN (L. A. Belady, "A study of replacement algorithms for a virtual-storage computer",
IBM Systems Journal 5(2), 1966) evicts the block whose next use is furthest away; it is the best
any cache can do, and a plan tells the future. The disk tier hands its blocks in LRU order to
:func:`next_use_order`, which puts first the blocks no plan needs any more (not in a plan, or
already read), in LRU order, then the planned ones, needed last first.
"""

from __future__ import annotations

from datacache.plan.cursor import PlanCursor

GRACE = 16  # files just behind the position: other processes of the job may still be reading them


def next_use_order(rows, cursors: list[PlanCursor], grace: int = GRACE) -> list[tuple]:
    """``rows`` (tuples whose first item is a block key ``dataset/fid/index`` or its file
    ``dataset/fid``, as the disk tier gives them, in LRU order, least recent first) in eviction
    order.

    A block's next use is, over ``cursors``, the smallest ``plan position - reader position``
    of its file version ahead of a reader. A block no plan needs any more (its version is in
    no plan, or was read more than ``grace`` files ago) goes first, in LRU order; then the
    blocks read within the last ``grace`` files (other readers of the job may still be on them,
    but they are needed no more), in LRU order; then those ahead, furthest next use first."""
    never, behind, ahead = [], [], []
    for row in rows:
        parts = row[0].split("/")
        fid = parts[1] if len(parts) >= 2 else ""
        distance, recent = None, False
        for c in cursors:
            at = c.position_of(fid)
            if at is None:
                continue
            if at > c.position:
                d = at - c.position
                distance = d if distance is None else min(distance, d)
            elif at >= c.position - grace:
                recent = True
        if distance is not None:
            ahead.append((distance, row))
        elif recent:
            behind.append(row)
        else:
            never.append(row)
    ahead.sort(key=lambda t: -t[0])  # stable: equal distances stay in LRU order
    return never + behind + [row for _, row in ahead]
