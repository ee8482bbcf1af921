"""A plan resolved against the manifest a reader has, with the reader's position in it."""

from __future__ import annotations

from itertools import accumulate

from datacache.cache.blocks import file_id
from datacache.manifest import Manifest
from datacache.plan.plan import Plan

JUMP = 64  # files a read may be ahead of the position and still be the reader's progress


class PlanCursor:
    """``plan``'s files as the current versions of ``manifest`` (a path gone since the plan was
    made is left out), cut at ``block_size`` bytes.

    ``entries``: FileEntry in plan order; ``offsets[i]``: bytes of the files before position
    ``i`` (``offsets[len(entries)]`` the total); ``own``: the furthest position this process
    has read (-1: none yet); ``position``: the reader's progress that prefetch and eviction go
    by, the slowest reading process's ``own`` on the node (:meth:`seen`), else ``own``. Reads
    follow the plan, so positions are progress; a file out of the plan moves nothing."""

    def __init__(self, plan: Plan, manifest: Manifest, block_size: int):
        self.plan = plan
        self.entries = [e for e in map(manifest.lookup, plan.paths) if e is not None]
        self.offsets = [0, *accumulate(e.size for e in self.entries)]
        self._at = {e.path: i for i, e in enumerate(self.entries)}
        self._by_file = {file_id(e.mount, e.ufs_path, e.version, block_size): i for i, e in enumerate(self.entries)}
        self.own = -1  # the furthest position this process read
        self._node: int | None = None  # the slowest reader's position on the node, when known
        self._stray = -JUMP - 2  # the last read further ahead than JUMP

    def __len__(self) -> int:
        return len(self.entries)

    def advance(self, path: str) -> bool:
        """Note a read of dataset ``path``; True when it is in the plan. The position moves to
        it if it is further on by at most ``JUMP`` files (other processes of the job read the
        files between), or at most that far past another read further ahead (a job resumed
        further on); a lone read further ahead is a read out of order and moves nothing."""
        i = self._at.get(path)
        if i is None:
            return False
        if self.own < i <= self.own + JUMP or self._stray < i <= self._stray + JUMP:
            self.own = i
        elif i > self.own:
            self._stray = i
        return True

    @property
    def position(self) -> int:
        return self.own if self._node is None else min(self._node, self.own)

    @position.setter
    def position(self, value: int) -> None:
        self.own, self._node = value, None

    def seen(self, slowest: int | None) -> None:
        """The slowest reading process of the node is at ``slowest`` (None: unknown), see
        :func:`.channel.share_position`: DataLoader workers read parts of the plan at their own
        pace, and what one has passed another may still need."""
        self._node = slowest

    def position_of(self, fid: str) -> int | None:
        """The plan position of the file version ``fid`` (a block key's file id), or None."""
        return self._by_file.get(fid)
