"""Eviction by next use for a process that serves blocks but reads no plan file itself: a cache
worker of the node.

A reading process ranks its own disk tier's victims by the plans it follows
(:class:`~datacache.plan.follow.PlanFollower`). A cache worker sees block requests, not file
opens, so it never learns a reader's position from its own reads; it reads the plans and the
positions the node's readers report (:func:`.channel.share_position`) from the same dataset
directory, when its tier evicts. Each worker holds the blocks hashing to it, so ranking them by
the plans' next use keeps, over the workers together, the files needed soonest. Workers that do
not share the readers' ``$DATACACHE_HOME`` (pods of another node) find no plan and stay LRU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable

from datacache.manifest import Manifest
from datacache.plan.channel import POLL_S, PlanWatcher, share_position
from datacache.plan.cursor import PlanCursor
from datacache.plan.nextuse import next_use_order


class PlanRanking:
    """``rank_victims`` of a worker's disk tier (see :meth:`DiskTier._eviction_order`): the rows
    in next-use order of the plans published for ``dataset`` in ``dataset_dir``, from the slowest
    position the node's readers reported; the rows as given (LRU) while no plan is published.
    ``load_manifest()``: the dataset's current manifest (None when it has none), read when the
    plans change; ``block_size``: bytes, for the plans' file ids. The plan directory is looked at
    no more than once per ``interval`` seconds."""

    def __init__(self, dataset_dir: str, dataset: str, load_manifest: Callable[[], Manifest | None],
                 block_size: int, interval: float = POLL_S):
        self.dataset_dir = dataset_dir
        self.dataset = dataset
        self.load_manifest = load_manifest
        self.block_size = block_size
        self.watcher = PlanWatcher(dataset_dir, interval)
        self.cursors: list[PlanCursor] = []

    def __call__(self, rows: Iterable[tuple]) -> Iterable[tuple]:
        changed, plans = self.watcher.poll()

        if changed:
            mine = [p for p in plans.values() if p.dataset == self.dataset]
            manifest = self.load_manifest() if mine else None
            self.cursors = [PlanCursor(p, manifest, self.block_size) for p in mine] if manifest is not None else []
        if not self.cursors:
            return rows
        for cursor in self.cursors:
            with contextlib.suppress(OSError):  # a position file being replaced: the last one stays
                slowest = share_position(self.dataset_dir, cursor.plan, -1)  # -1: read, report nothing
                if slowest is not None:
                    cursor.position = slowest
        return next_use_order(rows, self.cursors)
