"""Membership: which cache workers of a runtime are alive, and where.

Embedded mode keeps it in the embedded state database (``$DATACACHE_HOME/state.db``, table
``workers``): each worker inserts its row when it starts listening, refreshes ``heartbeat`` every ``HEARTBEAT_S`` and
deletes the row when it stops cleanly. A worker that died without deleting its row (kill -9, a
crash, a lost node) expires when its heartbeat is older than ``TTL_S``; clients also stop asking a
worker as soon as a connection to it fails, so the TTL only bounds how long a dead worker is
listed, never how long reads fail.

A worker being drained before a scale-in (:meth:`Membership.drain`, table ``draining``, keyed by
worker id *and* pid so a later process of the same index is never affected) is left out of
:meth:`Membership.live`, the list placement ranks, so new reads and warmups go to the workers that
stay; it is still listed by :meth:`Membership.draining`, so they can copy its blocks while it hands
them off (see :mod:`.peers`). On Kubernetes the same role is played by the workers' headless
Service: :func:`open_membership` returns a :class:`~datacache.cluster.discovery.DnsMembership`
there, with the same ``live(namespace, runtime)`` and ``close()``.

Times are wall-clock seconds (``time.time()``), shared by every process of the machine.
"""

from __future__ import annotations

import json
import os
import time

from datacache.state import StateStore
from datacache.cluster.member import Member
from datacache.errors import ConfigError

HEARTBEAT_S = 1.0
TTL_S = 5.0


class Membership(StateStore):
    """Worker rows per runtime (``namespace``/``name``) in ``home``'s state database."""

    def __init__(self, home: str, ttl: float = TTL_S):
        super().__init__(home)
        self.ttl = ttl
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS workers (namespace TEXT, runtime TEXT, worker_id TEXT, url TEXT,"
            " node TEXT, pid INTEGER, disk TEXT, heartbeat REAL, PRIMARY KEY (namespace, runtime, worker_id))")
        self._db.execute("CREATE TABLE IF NOT EXISTS draining (namespace TEXT, runtime TEXT, worker_id TEXT,"
                         " pid INTEGER, PRIMARY KEY (namespace, runtime, worker_id))")

    def register(self, namespace: str, runtime: str, member: Member) -> None:
        """Insert or replace ``member``'s row with a fresh heartbeat."""
        self._db.execute("INSERT OR REPLACE INTO workers VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                         (namespace, runtime, member.worker_id, member.url, member.node, member.pid,
                          json.dumps(member.disk), time.time()))

    def heartbeat(self, namespace: str, runtime: str, worker_id: str, pid: int) -> bool:
        """Refresh the row of ``worker_id`` if it is still ``pid``'s; False when the row is gone."""
        cur = self._db.execute("UPDATE workers SET heartbeat=? WHERE namespace=? AND runtime=? AND worker_id=?"
                               " AND pid=?", (time.time(), namespace, runtime, worker_id, pid))
        return cur.rowcount > 0

    def remove(self, namespace: str, runtime: str, worker_id: str, pid: int | None = None) -> None:
        """Delete a worker's row (only if it still belongs to ``pid``, when given), then its drain
        mark (in that order: the worker never shows up as live in between)."""
        for table in ("workers", "draining"):
            sql = f"DELETE FROM {table} WHERE namespace=? AND runtime=? AND worker_id=?"
            args: tuple = (namespace, runtime, worker_id)
            if pid is not None:
                sql, args = sql + " AND pid=?", args + (pid,)
            self._db.execute(sql, args)

    def drain(self, namespace: str, runtime: str, worker_id: str, pid: int) -> None:
        """Mark process ``pid`` of ``worker_id`` as draining: out of :meth:`live` from now on."""
        self._db.execute("INSERT OR REPLACE INTO draining VALUES (?, ?, ?, ?)", (namespace, runtime, worker_id, pid))

    def members(self, namespace: str, runtime: str) -> list[Member]:
        """Every registered worker of the runtime, live or not, draining or not, by worker index."""
        rows = self._db.execute(
            "SELECT w.worker_id, w.url, w.node, w.pid, w.disk, w.heartbeat, d.pid IS NOT NULL FROM workers w"
            " LEFT JOIN draining d ON d.namespace=w.namespace AND d.runtime=w.runtime AND d.worker_id=w.worker_id"
            " AND d.pid=w.pid WHERE w.namespace=? AND w.runtime=?", (namespace, runtime)).fetchall()
        found = [Member(w, u, n, p, json.loads(d), h, bool(x)) for w, u, n, p, d, h, x in rows]
        return sorted(found, key=lambda m: m.index)

    def _fresh(self, namespace: str, runtime: str) -> list[Member]:
        now = time.time()
        return [m for m in self.members(namespace, runtime) if now - m.heartbeat < self.ttl]

    def live(self, namespace: str, runtime: str) -> list[Member]:
        """Workers whose heartbeat is younger than the TTL, not draining: the ones placement ranks."""
        return [m for m in self._fresh(namespace, runtime) if not m.draining]

    def draining(self, namespace: str, runtime: str) -> list[Member]:
        """Workers whose heartbeat is younger than the TTL that are being drained."""
        return [m for m in self._fresh(namespace, runtime) if m.draining]


def external() -> bool:
    """Whether an orchestrator runs the workers and DNS lists them (``DATACACHE_MEMBERSHIP=dns``,
    set by the operator in every pod) rather than this machine's embedded plane (``embedded``, the
    default). Raises ``ConfigError`` naming the variable when it is neither."""
    kind = os.environ.get("DATACACHE_MEMBERSHIP", "embedded")
    if kind not in ("embedded", "dns"):
        raise ConfigError("environment", [("DATACACHE_MEMBERSHIP", f"{kind!r} is not a membership kind "
                                                                   "(set embedded or dns)")])
    return kind == "dns"


def open_membership(home: str):
    """Where clients and workers find the live workers: ``Membership(home)`` (embedded, the
    default) or, with ``DATACACHE_MEMBERSHIP=dns`` (set by the operator in every pod), a
    ``DnsMembership`` asking ``DATACACHE_DNS_NAMESERVER`` (``host:port``; default: the pod's
    ``/etc/resolv.conf``) for names under ``DATACACHE_CLUSTER_DOMAIN`` (default ``cluster.local``).
    Both offer ``live(namespace, runtime) -> list[Member]`` and ``close()``. Raises ``ConfigError``
    naming the variable when ``DATACACHE_MEMBERSHIP`` is neither ``embedded`` nor ``dns``."""
    if not external():
        return Membership(home)
    from datacache.cluster.discovery import DnsMembership  # dnspython: only needed on Kubernetes

    return DnsMembership(os.environ.get("DATACACHE_DNS_NAMESERVER") or None,
                         os.environ.get("DATACACHE_CLUSTER_DOMAIN", "cluster.local"))
