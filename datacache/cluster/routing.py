"""Routing: for one block key, the workers to ask, in order, and which of them can be read directly.

Failover order for a block is its HRW ranking over the live workers (see :mod:`.placement`),
minus workers this client has just seen fail. A worker that refuses a connection, times out or
drops a response is *suspected* for ``suspect_s`` seconds and skipped, so a dead owner costs one
failed connection, not one per block, long before its heartbeat expires. A suspicion is tied to the
worker's address: a worker restarted on a new port is trusted again at once.

Short-circuit rule: when a worker runs on this node (same host name) and its cache directory is
readable by this process, its blocks are read straight from the block files through a
:class:`~datacache.cache.disk.DiskTier` opened on that directory, which verifies each block's
checksum (a corrupt one is dropped and read over HTTP instead). That saves a copy through the
worker and the HTTP framing; the worker still owns writes, eviction and fills.
"""

from __future__ import annotations

import os
import socket
import threading
import time

from datacache.cache.disk import DiskTier
from datacache.cluster import placement
from datacache.cluster.membership import Member, Membership


class Router:
    """Live workers of runtime ``namespace``/``runtime`` in ``membership`` (which the router closes),
    refreshed every ``refresh_s`` seconds; ``short_circuit``: whether local block files may be read
    directly; ``node``: this host's name."""

    def __init__(self, membership: Membership, namespace: str, runtime: str, refresh_s: float = 1.0,
                 suspect_s: float = 5.0, short_circuit: bool = True, node: str | None = None):
        self._membership = membership
        self._runtime = (namespace, runtime)
        self.refresh_s = refresh_s
        self.suspect_s = suspect_s
        self.short_circuit = short_circuit
        self.node = node or socket.gethostname()
        self._members: list[Member] = []
        self._fetched = float("-inf")
        self._suspects: dict[tuple[str, str], float] = {}
        self._tiers: dict[str, DiskTier | None] = {}
        self._lock = threading.Lock()

    def members(self) -> list[Member]:
        """Live workers (cached for ``refresh_s``)."""
        with self._lock:
            if time.monotonic() - self._fetched > self.refresh_s:
                self._members = self._membership.live(*self._runtime)
                self._fetched = time.monotonic()
            return self._members

    def healthy(self) -> list[Member]:
        """Live workers not currently suspected."""
        now = time.monotonic()
        return [m for m in self.members() if self._suspects.get((m.worker_id, m.url), 0.0) <= now]

    def candidates(self, key: str) -> list[Member]:
        """Healthy workers, best owner of ``key`` first."""
        by_id = {m.worker_id: m for m in self.healthy()}
        return [by_id[w] for w in placement.rank(key, by_id)]

    def suspect(self, member: Member) -> None:
        """Skip ``member`` for ``suspect_s`` seconds."""
        self._suspects[(member.worker_id, member.url)] = time.monotonic() + self.suspect_s

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
        if not (os.access(path, os.R_OK | os.X_OK) and os.path.exists(os.path.join(path, "cache.db"))):
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
