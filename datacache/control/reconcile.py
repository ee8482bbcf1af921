"""Reconcile steps as plain functions: (desired spec, observed state) -> status.

The embedded host and the Kubernetes operator both call these, so a status means the same thing
wherever it is shown. Numbers come from observations (the manifest, what the cache holds, hit
counters), never from estimates. Field names and phases follow Fluid's Dataset/Runtime status.
"""

from __future__ import annotations

from dataclasses import dataclass

from datacache.api.quantity import format_bytes
from datacache.control.state import now_iso


@dataclass(frozen=True)
class DatasetObservation:
    """What is true of a dataset now: manifest totals (``file_num``, ``ufs_total`` bytes), bytes of
    its current-version blocks in the cache (``cached``), the cache's ``capacity`` (bytes), block
    ``hits``/``misses``, and whether a runtime is bound and the manifest exists."""

    bound: bool
    synced: bool
    file_num: int = 0
    ufs_total: int = 0
    cached: int = 0
    capacity: int = 0
    hits: int = 0
    misses: int = 0
    error: str = ""


def percentage(part: int, whole: int) -> str:
    """Fluid's ``cachedPercentage`` text: one decimal and a percent sign; 100.0% for an empty whole."""
    return "100.0%" if whole == 0 else f"{100.0 * part / whole:.1f}%"


def dataset_status(obs: DatasetObservation) -> dict:
    """The Dataset's ``status`` document for observation ``obs``."""
    if obs.error:
        phase, cond = "Failed", ("Ready", "False", "SyncFailed", obs.error)
    elif not obs.bound:
        phase, cond = "NotBound", ("Ready", "False", "NoRuntime", "no CacheRuntime with the dataset's name and namespace")
    elif not obs.synced:
        phase, cond = "Pending", ("Ready", "False", "NotSynced", "metadata not synced yet")
    else:
        phase, cond = "Bound", ("Ready", "True", "Bound", "the dataset is bound to its runtime")
    total = obs.hits + obs.misses
    return {
        "phase": phase,
        "conditions": [{"type": cond[0], "status": cond[1], "reason": cond[2], "message": cond[3],
                        "lastTransitionTime": now_iso()}],
        "ufsTotal": format_bytes(obs.ufs_total),
        "fileNum": obs.file_num,
        "cacheStates": {
            "cached": format_bytes(obs.cached),
            "cacheCapacity": format_bytes(obs.capacity),
            "cachedPercentage": percentage(obs.cached, obs.ufs_total),
            "cacheHitRatio": "0.0%" if total == 0 else f"{100.0 * obs.hits / total:.1f}%",
        },
    }


def runtime_status(desired: int, workers: list[dict]) -> dict:
    """The CacheRuntime's ``status`` from its ``desired`` worker count and the observed workers
    (dicts with ``ready`` (bool), ``capacity`` and ``used`` in bytes)."""
    ready = sum(1 for w in workers if w.get("ready"))
    if desired and ready == desired:
        phase = "Ready"
    elif ready:
        phase = "PartialReady"
    else:
        phase = "NotReady"
    return {
        "phase": phase,
        "desiredWorkers": desired,
        "readyWorkers": ready,
        "cacheCapacity": format_bytes(sum(w.get("capacity", 0) for w in workers)),
        "cached": format_bytes(sum(w.get("used", 0) for w in workers)),
        "workers": workers,
    }


def dataload_status(result, started_iso: str) -> dict:
    """The DataLoad's ``status`` from a ``dataload.WarmupResult``."""
    return {
        "phase": "Complete" if result.ok else "Failed",
        "duration": f"{result.duration:.1f}s",
        "targets": [
            {"path": t.path, "files": t.files, "bytes": t.bytes, "cachedBytes": t.cached_bytes,
             "phase": t.phase, "failures": t.failures}
            for t in result.targets
        ],
        "lastScheduleTime": started_iso,
        **({"lastSuccessfulTime": now_iso()} if result.ok else {}),
    }
