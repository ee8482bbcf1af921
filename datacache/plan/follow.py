"""A DatasetClient following the plans published for its dataset (see :mod:`.channel`).

On each file a reader opens (or reads without opening), the client's follower polls the plan
directory (throttled), moves the reader's position in every plan that names the file, shares it
with the node's other reading processes (prefetch and eviction go by the slowest:
:func:`.channel.share_position`) and lets the prefetchers slide. While a plan is active the disk tier evicts by next use
(:mod:`.nextuse`); when the last plan is withdrawn it is LRU again.
"""

from __future__ import annotations

import functools
import logging
import os
import threading

from datacache.manifest import FileEntry
from datacache.plan.channel import PlanWatcher, claim_prefetch, share_position
from datacache.plan.cursor import PlanCursor
from datacache.plan.nextuse import next_use_order
from datacache.plan.prefetch import THREADS, Pace, Prefetcher, ahead_bound

log = logging.getLogger(__name__)


class PlanFollower:
    """Follows the plans of ``client``'s dataset (``dataset_dir``: its directory under the
    home). ``ahead_bytes``: prefetch bound (default :func:`ahead_bound` of the cache's capacity);
    ``threads``: prefetch threads per plan. ``prefetchers``: the running ones, by rank: one
    process per node prefetches a plan (the first to claim it, :func:`.channel.claim_prefetch`;
    when it stops or dies, the next to poll takes the role over); every process ranks its
    evictions by the plans."""

    def __init__(self, client, dataset_dir: str, ahead_bytes: int | None = None, threads: int = THREADS,
                 interval: float | None = None):
        self.client = client
        self.watcher = PlanWatcher(dataset_dir) if interval is None else PlanWatcher(dataset_dir, interval)
        self.ahead_bytes = ahead_bytes
        self.threads = threads
        self.dataset_dir = dataset_dir
        self.cursors: list[PlanCursor] = []
        self.prefetchers: dict[int, Prefetcher] = {}
        self._paces: dict[int, Pace] = {}  # by rank, kept across plans: the last epoch's pace
        self._claims: list[int] = []  # prefetch roles held (channel.claim_prefetch)
        self._unclaimable: set[int] = set()  # ranks whose role could not be asked for (a read-only home)
        self._ufs_opening = False
        self._lock = threading.Lock()

    def __call__(self, entry: FileEntry) -> None:
        """A reader opened (or read) ``entry``."""
        looked = self.watcher.looked
        changed, plans = self.watcher.poll()
        if changed:
            with self._lock:
                self._follow(plans)
        share = self.watcher.looked != looked  # at most once per poll interval
        if share and len(self.prefetchers) + len(self._unclaimable) < len(self.cursors):
            with self._lock:
                self._claim(self.cursors)  # a role its process gave up (it stopped or died)
        for cursor in self.cursors:
            moved = cursor.advance(entry.path)
            if share:
                try:
                    cursor.seen(share_position(self.dataset_dir, cursor.plan, cursor.own))
                    moved = True
                except OSError:  # a read-only home: this process's own reads only
                    pass
            p = self.prefetchers.get(cursor.plan.rank) if moved else None
            if p is not None:
                p.moved()

    def _follow(self, plans: dict) -> None:
        self._release()
        source = self.client.source
        mine = [p for p in plans.values() if p.dataset == self.client.name]
        self.cursors = [PlanCursor(p, self.client.manifest, source.block_size) for p in mine]
        self._claim(self.cursors)
        ranking = functools.partial(next_use_order, cursors=self.cursors) if self.cursors else None
        store = getattr(source, "store", None)  # this process's tiers (a cluster source has none)
        if store is not None:
            store.rank_victims_by(ranking)
            if self.cursors:
                self._open_ufs()

    def _open_ufs(self) -> None:
        """Open the dataset's UFS mounts on a thread of their own, once: this process fills from
        the UFS itself (prefetch, demand misses), and opening a mount imports its client (fsspec's
        HTTP one and aiohttp: 0.15-0.25 s here), which the plan's first fill and first miss, due at
        the plan's start, would otherwise both wait for (measured: a later planned epoch's first
        read 0.2-0.4 s -> 0.02-0.04 s). Mounts stay closed without a plan (a reader
        of cached blocks needs no UFS client nor credentials); a mount that fails to open here
        fails again, and is reported, at the read that needs it."""
        if self._ufs_opening:
            return
        self._ufs_opening = True

        def run() -> None:
            try:
                self.client.ufs.mounts
            except Exception as err:  # noqa: BLE001 - reported by the read that needs the UFS
                log.debug("UFS mounts of %s not opened ahead of the plan: %s", self.client.name, type(err).__name__)

        threading.Thread(target=run, name="datacache-ufs-open", daemon=True).start()

    def _claim(self, cursors: list[PlanCursor]) -> None:
        """Prefetch, from this process, each plan of ``cursors`` that no process of the node
        prefetches yet (:func:`.channel.claim_prefetch`): at a new plan, and at each poll after,
        so that the role of a process that stopped or died (the kernel drops its ``flock``)
        passes to another at once, not at the next plan. Under ``self._lock``."""
        source = self.client.source
        ahead = None
        for c in cursors:
            if c.plan.rank in self.prefetchers or c.plan.rank in self._unclaimable:
                continue
            try:
                fd = claim_prefetch(self.dataset_dir, c.plan.rank)
            except OSError as err:  # a read-only home: reads go on, without prefetch (not asked again)
                log.info("plan of rank %d not prefetched: %s", c.plan.rank, err)
                self._unclaimable.add(c.plan.rank)
                continue
            if fd is None:  # another process of this node prefetches it
                continue
            if ahead is None:
                ahead = self.ahead_bytes or ahead_bound(source.usage()[1], source.block_size)
            self._claims.append(fd)
            # Positions are reported at one process's poll and read at another's: two intervals old.
            self.prefetchers[c.plan.rank] = Prefetcher(source, c, ahead, self.threads, lag_s=2 * self.watcher.interval,
                                                       pace=self._paces.setdefault(c.plan.rank, Pace()))

    def _release(self, wait: float = 0.0) -> None:
        """Stop the prefetchers (waiting up to ``wait`` seconds each) and give their roles up."""
        for p in self.prefetchers.values():
            p.stop(wait)
        self.prefetchers = {}
        for fd in self._claims:
            os.close(fd)
        self._claims = []
        self._unclaimable.clear()

    def close(self) -> None:
        """Stop prefetching, waiting up to 10 s for the fills in flight."""
        with self._lock:
            self._release(wait=10.0)
