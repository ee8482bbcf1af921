"""When DataLoads run: Cron schedules (via :mod:`croniter`), OnEvent matching against a metadata
sync's diff, and the bounded history of ``datacache warmup`` records.

Plain functions over models and documents, so the embedded controller and tests share them.
Times are epoch seconds (floats) unless named ``*_iso`` (RFC 3339 UTC text, as in status).
"""

from __future__ import annotations

from datetime import datetime, timezone
from itertools import chain
from typing import Iterable

from croniter import croniter

from datacache.api.quantity import format_bytes
from datacache.state import iso
from datacache.manifest import Manifest, ManifestDiff, normalize

WARMUP_LABEL = "datacache.io/warmup"
"""Label marking the DataLoads that ``datacache warmup`` created (value: the dataset name)."""
WARMUP_HISTORY = 10
"""Warmup records kept per dataset; older ones are deleted when a new warmup starts."""


def parse_iso(text: str) -> float:
    """Epoch seconds of an RFC 3339 UTC time as status writes it (``2026-01-02T03:04:05Z``)."""
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()


def next_fire(schedule: str, after: float) -> float:
    """The first time (epoch seconds, UTC) strictly after ``after`` that cron ``schedule`` names."""
    return croniter(schedule, datetime.fromtimestamp(after, timezone.utc)).get_next(float)


def next_schedule_iso(doc: dict) -> str | None:
    """When ``datacache controller`` runs a Cron DataLoad (document) next: the schedule's first
    time after its last run (or creation), as RFC 3339 UTC text; None for other policies. A time
    in the past means it is due (it runs at the controller's next pass)."""
    spec, status = doc.get("spec") or {}, doc.get("status") or {}
    base = status.get("lastScheduleTime") or (doc.get("metadata") or {}).get("creationTimestamp")
    if spec.get("policy") != "Cron" or not spec.get("schedule") or not base:
        return None
    return iso(next_fire(spec["schedule"], parse_iso(base)))


def cron_due(schedule: str, last_schedule_iso: str | None, created_iso: str | None, now: float) -> bool:
    """Whether a Cron DataLoad should run at ``now``: its next fire time after the last run (or
    after its creation) has come. Runs missed while nothing was watching collapse into one."""
    base = last_schedule_iso or created_iso
    return base is not None and next_fire(schedule, parse_iso(base)) <= now


def outcome(result) -> str:
    """One line for a finished run (a ``dataload.WarmupResult``): ``Complete in 1.2s, 40.00MiB
    loaded from the UFS``, or ``Failed ...`` naming the targets not completely cached."""
    phase = "Complete" if result.ok else "Failed"
    line = f"{phase} in {result.duration:.1f}s, {format_bytes(result.loaded_bytes)} loaded from the UFS"
    failed = [t.path for t in result.targets if t.phase != "Complete"]
    return line + (f"; not completely cached: {', '.join(failed)}" if failed else "")


def touched(targets: Iterable[str], manifest: Manifest, diff: ManifestDiff, also: Iterable[str] = ()) -> list[str]:
    """Added or changed paths of ``diff``, and the paths ``also`` (changes found by readers), that
    lie under ``targets`` (dataset paths: directories, files or globs, as :meth:`Manifest.select`
    reads them; none means the whole dataset), sorted."""
    changed = {normalize(p) for p in chain(diff.paths("added"), diff.paths("changed"), also)}
    if not changed:
        return []
    patterns = list(targets) or ["/"]
    selected = {normalize(e.path) for pattern in patterns for e in manifest.select(pattern)}
    return sorted(changed & selected)


def stale_warmups(docs: list[dict], dataset: str, keep: int = WARMUP_HISTORY) -> list[str]:
    """Names of the warmup DataLoads of ``dataset`` beyond the newest ``keep`` (names embed the
    creation time, so name order is age order)."""
    mine = sorted(d["metadata"]["name"] for d in docs
                  if (d["metadata"].get("labels") or {}).get(WARMUP_LABEL) == dataset)
    return mine[:-keep] if keep > 0 else mine
