"""Embedded state: resources and their status in one SQLite database under ``$DATACACHE_HOME``.

Each row is one resource document (the same Kubernetes-shaped JSON that ``-o json`` prints), keyed
by (kind, namespace, name). Writes are single statements, so a killed process leaves either the old
or the new document, never half of one. The file is 0600 inside a 0700 home.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from datetime import datetime, timezone

from datacache import private


def default_home() -> str:
    """``$DATACACHE_HOME``, else ``~/.local/share/datacache``."""
    return os.environ.get("DATACACHE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share", "datacache")


def iso(epoch: float) -> str:
    """RFC 3339 UTC text (seconds) of ``epoch`` seconds, as status fields hold times."""
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_iso() -> str:
    """The current time as :func:`iso` writes it."""
    return iso(time.time())


class StateStore:
    """Resource documents (dicts) by kind, namespace and name."""

    def __init__(self, home: str):
        private.makedirs(home)
        path = private.touch(os.path.join(home, "state.db"))
        self._db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        for suffix in ("-wal", "-shm"):
            if os.path.exists(path + suffix):
                os.chmod(path + suffix, private.FILE_MODE)
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS resources (kind TEXT, namespace TEXT, name TEXT, doc TEXT,"
            " updated REAL, PRIMARY KEY (kind, namespace, name))"
        )

    def put(self, doc: dict) -> dict:
        """Insert or replace ``doc``'s metadata and spec, keeping its stored status and creation
        time. Returns the stored document."""
        kind, meta = doc["kind"], doc["metadata"]
        ns = meta.get("namespace", "default")
        old = self.get(kind, meta["name"], ns)
        doc = json.loads(json.dumps(doc))
        doc["metadata"]["namespace"] = ns
        doc["metadata"]["creationTimestamp"] = (old or doc)["metadata"].get("creationTimestamp") or now_iso()
        if old and "status" in old:
            doc["status"] = old["status"]
        self._write(kind, ns, meta["name"], doc)
        return doc

    def set_status(self, kind: str, name: str, namespace: str, status: dict) -> dict | None:
        doc = self.get(kind, name, namespace)
        if doc is None:
            return None
        doc["status"] = status
        self._write(kind, namespace, name, doc)
        return doc

    def _write(self, kind: str, ns: str, name: str, doc: dict) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO resources VALUES (?, ?, ?, ?, ?)",
            (kind, ns, name, json.dumps(doc), time.time()),
        )

    def get(self, kind: str, name: str, namespace: str = "default") -> dict | None:
        row = self._db.execute(
            "SELECT doc FROM resources WHERE kind=? AND namespace=? AND name=?", (kind, namespace, name)
        ).fetchone()
        return json.loads(row[0]) if row else None

    def list(self, kind: str, namespace: str | None = None) -> list[dict]:
        if namespace is None:
            rows = self._db.execute("SELECT doc FROM resources WHERE kind=? ORDER BY namespace, name", (kind,))
        else:
            rows = self._db.execute(
                "SELECT doc FROM resources WHERE kind=? AND namespace=? ORDER BY name", (kind, namespace))
        return [json.loads(r[0]) for r in rows]

    def delete(self, kind: str, name: str, namespace: str = "default") -> bool:
        cur = self._db.execute(
            "DELETE FROM resources WHERE kind=? AND namespace=? AND name=?", (kind, namespace, name))
        return cur.rowcount > 0

    def close(self) -> None:
        self._db.close()
