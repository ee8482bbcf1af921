"""Routing: for one block key, the workers to ask, in order, and which of them can be read directly.

Failover order for a block is its HRW ranking over the live workers (see :mod:`.placement`),
minus workers this client has just seen fail. A worker that refuses a connection, times out or
drops a response is *suspected* and skipped, so a dead owner costs one failed connection, not one
per block, long before its heartbeat expires. A suspicion lasts ``suspect_s`` seconds and doubles
with each failure in a row (up to ``SUSPECT_MAX_S``), so a worker that keeps stalling costs one
timeout per minute, not one per ``suspect_s``; an answer clears it. A suspicion is tied to the
worker's address: a worker restarted on a new port is trusted again at once.

Short-circuit rule: when a worker runs on this node (same host name) and its cache directory is
readable by this process, its blocks are read straight from the block files through a
:class:`~datacache.cache.disk.DiskTier` opened on that directory, which verifies each block's
checksum (a corrupt one is dropped and read over HTTP instead). That saves a copy through the
worker and the HTTP framing; the worker still owns writes, eviction and fills.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

from datacache.cache.disk import DiskTier, holds_cache
from datacache.cluster import placement
from datacache.cluster.member import Member
from datacache.cluster.membership import Membership

log = logging.getLogger(__name__)

SUSPECT_MAX_S = 60.0


class Router:
    """Live workers of runtime ``namespace``/``runtime`` in ``membership`` (a ``Membership`` or a
    ``DnsMembership``, see :func:`.membership.open_membership`; the router closes it), refreshed
    every ``refresh_s`` seconds; ``short_circuit``: whether local block files may be read
    directly; ``node``: this host's name; ``strict``: whether a membership that cannot be read
    (``OSError``, e.g. DNS down past its stale bound) fails the caller, or is logged and the last
    list kept (a worker's peers: read-repair and hand-off only save UFS reads)."""

    def __init__(self, membership: Membership, namespace: str, runtime: str, refresh_s: float = 1.0,
                 suspect_s: float = 5.0, short_circuit: bool = True, node: str | None = None,
                 strict: bool = True):
        self._membership = membership
        self.strict = strict
        self._runtime = (namespace, runtime)
        self.refresh_s = refresh_s
        self.suspect_s = suspect_s
        self.short_circuit = short_circuit
        self.node = node or socket.gethostname()
        self._members: list[Member] = []
        self._draining: list[Member] = []
        self._fetched = float("-inf")
        self._failed = False  # the last read of the membership failed (the list kept is older)
        self._suspects: dict[tuple[str, str], tuple[float, int]] = {}  # -> (until, failures in a row)
        self._tiers: dict[str, DiskTier | None] = {}
        self._lock = threading.Lock()

    def members(self) -> list[Member]:
        """Live workers (cached for ``refresh_s``)."""
        with self._lock:
            if time.monotonic() - self._fetched > self.refresh_s:
                try:
                    self._members = self._membership.live(*self._runtime)
                    self._draining = self._membership.draining(*self._runtime)
                    self._failed = False
                except OSError as err:
                    if self.strict:
                        raise
                    self._failed = True
                    log.warning("%s: keeping the %d workers known before", err, len(self._members))
                self._fetched = time.monotonic()
            return self._members

    def refresh(self) -> list[Member]:
        """Live workers read now, not from the cache (a drain must see every drain mark)."""
        with self._lock:
            self._fetched = float("-inf")
        return self.members()

    def refresh_since(self, since: float) -> bool:
        """Read the live workers again unless they were read after ``since`` (a ``time.monotonic()``
        value); whether they were read now. A worker that registered before a request arrived is
        then known to whoever answers it, which a view up to ``refresh_s`` old does not promise.
        A membership whose last read failed (DNS down) is not read again before ``refresh_s``:
        each failed read may take a resolver's timeout."""
        with self._lock:
            if self._fetched >= since or self._failed:
                return False
            self._fetched = float("-inf")
        self.members()
        return True

    def draining(self) -> list[Member]:
        """Workers being drained (out of placement, still serving their blocks), as of the last
        refresh of :meth:`members`."""
        self.members()
        return self._draining

    def healthy(self) -> list[Member]:
        """Live workers not currently suspected."""
        now = time.monotonic()
        return [m for m in self.members() if self._suspects.get((m.worker_id, m.url), (0.0, 0))[0] <= now]

    def candidates(self, key: str) -> list[Member]:
        """Healthy workers, best owner of ``key`` first."""
        by_id = {m.worker_id: m for m in self.healthy()}
        return [by_id[w] for w in placement.rank(key, by_id)]

    def lookup(self, key: str, replicas: int = 1) -> list[Member]:
        """Healthy workers that may hold ``key``, in the order to ask (:func:`placement.lookup`)."""
        by_id = {m.worker_id: m for m in self.healthy()}
        return [by_id[w] for w in placement.lookup(key, by_id, replicas)]

    def suspect(self, member: Member) -> None:
        """Skip ``member`` for ``suspect_s`` seconds, doubled for each failure in a row."""
        with self._lock:
            failures = self._suspects.get((member.worker_id, member.url), (0.0, 0))[1] + 1
            wait = min(self.suspect_s * 2 ** (failures - 1), SUSPECT_MAX_S)
            self._suspects[(member.worker_id, member.url)] = (time.monotonic() + wait, failures)

    def trust(self, member: Member) -> None:
        """``member`` answered: forget its failures."""
        if self._suspects:
            self._suspects.pop((member.worker_id, member.url), None)

    def local_tier(self, member: Member) -> DiskTier | None:
        """A reader of ``member``'s disk level when the short-circuit rule allows one, else None."""
        path = member.disk.get("path")
        if not self.short_circuit or not path or member.node != self.node:
            return None
        with self._lock:
            if path not in self._tiers:
                self._tiers[path] = self._open(member.disk)
            return self._tiers[path]

    @staticmethod
    def _open(disk: dict) -> DiskTier | None:
        path = disk["path"]
        if not (os.access(path, os.R_OK | os.X_OK) and holds_cache(path)):
            return None
        try:
            return DiskTier(path, int(disk.get("quota", 1 << 40)), medium=disk.get("medium", "SSD"))
        except OSError:
            return None

    def close(self) -> None:
        with self._lock:
            for tier in self._tiers.values():
                if tier is not None:
                    tier.close()
            self._tiers.clear()
        self._membership.close()
