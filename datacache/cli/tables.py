"""Tables printed by ``datacache get`` (the columns of Fluid's ``kubectl get``)."""

from __future__ import annotations

from datetime import datetime, timezone

from datacache.api.quantity import format_bytes
from datacache.control.dataloads import next_schedule_iso

# (header, getter over a document); columns after WIDE_FROM appear with -o wide only.
COLUMNS = {
    "Dataset": [
        ("NAME", lambda d: d["metadata"]["name"]),
        ("UFS TOTAL SIZE", lambda d: _st(d, "ufsTotal")),
        ("CACHED", lambda d: _cs(d, "cached")),
        ("CACHE CAPACITY", lambda d: _cs(d, "cacheCapacity")),
        ("CACHED PERCENTAGE", lambda d: _cs(d, "cachedPercentage")),
        ("PHASE", lambda d: _st(d, "phase")),
        ("AGE", lambda d: age(d["metadata"].get("creationTimestamp"))),
        ("FILES", lambda d: _st(d, "fileNum")),
        ("CACHE HIT RATIO", lambda d: _cs(d, "cacheHitRatio")),
        ("LAST TRACE CACHED", lambda d: _cs(d, "lastTraceCached")),
    ],
    "CacheRuntime": [
        ("NAME", lambda d: d["metadata"]["name"]),
        ("DESIRED", lambda d: _st(d, "desiredWorkers")),
        ("READY", lambda d: _st(d, "readyWorkers")),
        ("CACHE CAPACITY", lambda d: _st(d, "cacheCapacity")),
        ("CACHED", lambda d: _st(d, "cached")),
        ("PHASE", lambda d: _st(d, "phase")),
        ("AGE", lambda d: age(d["metadata"].get("creationTimestamp"))),
        ("WORKERS (USED/CAPACITY)", lambda d: _workers(d)),
    ],
    "ThinRuntime": [
        ("NAME", lambda d: d["metadata"]["name"]),
        ("PROFILE", lambda d: d["spec"]["profileName"]),
        ("CACHE CAPACITY", lambda d: _st(d, "cacheCapacity")),
        ("CACHED", lambda d: _st(d, "cached")),
        ("PHASE", lambda d: _st(d, "phase")),
        ("AGE", lambda d: age(d["metadata"].get("creationTimestamp"))),
    ],
    "JuiceFSRuntime": [
        ("NAME", lambda d: d["metadata"]["name"]),
        ("CACHE CAPACITY", lambda d: _st(d, "cacheCapacity")),
        ("CACHED", lambda d: _st(d, "cached")),
        ("PHASE", lambda d: _st(d, "phase")),
        ("AGE", lambda d: age(d["metadata"].get("creationTimestamp"))),
    ],
    "ThinRuntimeProfile": [
        ("NAME", lambda d: d["metadata"]["name"]),
        ("FILE SYSTEM TYPE", lambda d: d["spec"]["fileSystemType"]),
        ("PLUGIN", lambda d: d["spec"].get("plugin") or ""),
        ("FUSE COMMAND", lambda d: (d["spec"].get("fuse") or {"command": [""]})["command"][0]),
        ("AGE", lambda d: age(d["metadata"].get("creationTimestamp"))),
    ],
    "DataLoad": [
        ("NAME", lambda d: d["metadata"]["name"]),
        ("DATASET", lambda d: d["spec"]["dataset"]["name"]),
        ("PHASE", lambda d: _st(d, "phase")),
        ("DURATION", lambda d: _st(d, "duration")),
        ("AGE", lambda d: age(d["metadata"].get("creationTimestamp"))),
        ("POLICY", lambda d: d["spec"].get("policy", "Once")),
        ("SCHEDULE", lambda d: d["spec"].get("schedule") or ""),
        ("LAST SCHEDULE", lambda d: age(_st(d, "lastScheduleTime") or None)),
        ("NEXT SCHEDULE", lambda d: next_schedule_iso(d) or ""),
        ("TARGETS (LOADED/TOTAL)", lambda d: _targets(d)),
    ],
    "DataMigrate": [
        ("NAME", lambda d: d["metadata"]["name"]),
        ("POLICY", lambda d: d["spec"].get("policy", "Once")),
        ("PHASE", lambda d: _st(d, "phase")),
        ("FILES (DONE/SKIPPED/TOTAL)", lambda d: _files(d)),
        ("BYTES", lambda d: _bytes(d)),
        ("DURATION", lambda d: _st(d, "duration")),
        ("AGE", lambda d: age(d["metadata"].get("creationTimestamp"))),
        ("RUN AFTER", lambda d: _after(d)),
        ("FAILURES", lambda d: str(len((d.get("status") or {}).get("failures") or []))),
        ("NEXT SCHEDULE", lambda d: next_schedule_iso(d) or ""),
    ],
    "DataProcess": [
        ("NAME", lambda d: d["metadata"]["name"]),
        ("DATASET", lambda d: d["spec"]["dataset"]["name"]),
        ("PHASE", lambda d: _st(d, "phase")),
        ("EXIT CODE", lambda d: _st(d, "exitCode")),
        ("DURATION", lambda d: _st(d, "duration")),
        ("AGE", lambda d: age(d["metadata"].get("creationTimestamp"))),
        ("RUN AFTER", lambda d: _after(d)),
        ("MOUNT PATH", lambda d: d["spec"]["mountPath"]),
    ],
}
WIDE_FROM = {"Dataset": 7, "CacheRuntime": 7, "DataLoad": 5, "DataMigrate": 7, "DataProcess": 6}


def _after(doc: dict) -> str:
    after = doc["spec"].get("runAfter")
    return f"{after['kind'].lower()}/{after['name']}" if after else ""


def _files(doc: dict) -> str:
    p = (doc.get("status") or {}).get("progress") or {}
    return f"{p['filesDone']:g}/{p.get('filesSkipped', 0):g}/{p['filesTotal']:g}" if "filesTotal" in p else ""


def _bytes(doc: dict) -> str:
    p = (doc.get("status") or {}).get("progress") or {}
    return f"{format_bytes(int(p['bytesDone']))}/{format_bytes(int(p['bytesTotal']))}" if "bytesTotal" in p else ""


def _st(doc: dict, key: str) -> str:
    value = (doc.get("status") or {}).get(key)
    return "" if value is None else str(value)


def _cs(doc: dict, key: str) -> str:
    return str(((doc.get("status") or {}).get("cacheStates") or {}).get(key) or "")


def _workers(doc: dict) -> str:
    """Per worker: ``name=used/capacity`` (``name=down`` when not ready)."""
    parts = []
    for w in (doc.get("status") or {}).get("workers") or []:
        short = str(w.get("name", "")).rsplit("-", 2)[-2:]
        label = "-".join(short)
        parts.append(f"{label}={format_bytes(w.get('used', 0))}/{format_bytes(w.get('capacity', 0))}"
                     if w.get("ready") else f"{label}=down")
    return ",".join(parts)


def _targets(doc: dict) -> str:
    """Per target: ``path=done/total`` bytes, loaded so far while Executing, cached once done."""
    parts = []
    for t in (doc.get("status") or {}).get("targets") or []:
        done = t.get("bytesDone", t.get("cachedBytes", 0))
        parts.append(f"{t.get('path')}={format_bytes(done)}/{format_bytes(t.get('bytes', 0))}")
    return ",".join(parts)


def age(created: str | None) -> str:
    """kubectl-style age (``42s``, ``5m``, ``3h``, ``2d``) of an RFC 3339 UTC time."""
    if not created:
        return ""
    then = datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    secs = int((datetime.now(timezone.utc) - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{secs // size}{unit}"
    return f"{max(secs, 0)}s"


def table(kind: str, docs: list[dict], wide: bool = False) -> str:
    """Plain aligned columns, as kubectl prints them (never truncated, safe to pipe)."""
    cols = COLUMNS[kind]
    if not wide:
        cols = cols[:WIDE_FROM.get(kind, len(cols))]
    return rows_table([h for h, _ in cols], [[get(doc) for _, get in cols] for doc in docs])


def rows_table(headers: list[str], rows: list[list[str]]) -> str:
    """``headers`` and ``rows`` as plain aligned columns."""
    rows = [headers] + rows
    widths = [max(len(r[i]) for r in rows) for i in range(len(headers))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
