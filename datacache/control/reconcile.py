"""Reconcile steps as plain functions: (desired spec, observed state) -> status.

The embedded host and the Kubernetes operator both call these, so a status means the same thing
wherever it is shown. Numbers come from observations (the manifest, what the cache holds, hit
counters), never from estimates. Field names and phases follow Fluid's Dataset/Runtime status.
"""

from __future__ import annotations

from dataclasses import dataclass

from datacache.api.quantity import format_bytes
from datacache.state import now_iso


@dataclass(frozen=True)
class DatasetObservation:
    """What is true of a dataset now: manifest totals (``file_num``, ``ufs_total`` bytes), bytes of
    its current-version blocks in the cache (``cached``), the cache's ``capacity`` (bytes), block
    ``hits``/``misses`` of readers (``remote_hits``: those of the hits served by a cache worker on
    another node), whether a runtime is bound and the manifest exists; ``updating``: a
    metadata sync runs now; ``sync_error``: why the last sync failed ('' when it did not);
    ``error``: why the cache cannot be read; ``not_ready``: why the runtime's engine cannot give
    its figures yet (its client not started: a state, not an error); ``cached_percentage``: the engine's own figure
    (``juicefs warmup --check``), else None (computed from ``cached`` and ``ufs_total``);
    ``trace``: ``(cached, total)`` bytes of the files the last recorded run read (None: no run
    recorded)."""

    bound: bool
    synced: bool
    file_num: int = 0
    ufs_total: int = 0
    cached: int = 0
    capacity: int = 0
    hits: int = 0
    misses: int = 0
    remote_hits: int = 0
    error: str = ""
    updating: bool = False
    sync_error: str = ""
    cached_percentage: str | None = None
    not_ready: str = ""
    trace: tuple[int, int] | None = None  # (cached, total) bytes of the last recorded run's files


def percentage(part: int, whole: int) -> str:
    """Fluid's percentage text: one decimal and a percent sign, rounded down (so ``100.0%`` means
    all of it: 488.28 KiB of 488.29 KiB is ``99.9%``, and a job gated on 100 % waits for the last
    byte); ``0.0%`` when ``whole`` is 0 (an empty dataset has nothing cached, and no reads have no
    hits). ``part`` and ``whole`` are integers (bytes, counts): exact, no float rounding."""
    if whole <= 0:
        return "0.0%"
    tenths = 1000 * part // whole
    return f"{tenths // 10}.{tenths % 10}%"


def dataset_status(obs: DatasetObservation) -> dict:
    """The Dataset's ``status`` document for observation ``obs``."""
    if obs.updating:
        phase, cond = "Updating", ("Ready", "False", "Syncing", "metadata sync running")
    elif obs.error:
        phase, cond = "Failed", ("Ready", "False", "CacheUnreadable", obs.error)
    elif obs.sync_error:  # the old manifest stays in use: its figures below are still true
        phase, cond = "Failed", ("Ready", "False", "SyncFailed", obs.sync_error)
    elif not obs.bound:
        phase, cond = "NotBound", ("Ready", "False", "NoRuntime", "no CacheRuntime with the dataset's name and namespace")
    elif not obs.synced:
        phase, cond = "Pending", ("Ready", "False", "NotSynced", "metadata not synced yet")
    elif obs.not_ready:  # bound and listed; the engine's figures wait for it
        phase, cond = "Bound", ("Ready", "False", "RuntimeNotReady", obs.not_ready)
    else:
        phase, cond = "Bound", ("Ready", "True", "Bound", "the dataset is bound to its runtime")
    total = obs.hits + obs.misses
    hit_ratio = percentage(obs.hits, total)
    synced = obs.synced and not obs.error and not obs.not_ready  # else no figure was measured
    return {
        "phase": phase,
        "conditions": [{"type": cond[0], "status": cond[1], "reason": cond[2], "message": cond[3],
                        "lastTransitionTime": now_iso()}],
        "ufsTotal": format_bytes(obs.ufs_total),
        "fileNum": obs.file_num,
        "cacheStates": {
            "cached": format_bytes(obs.cached) if synced else "-",
            "cacheCapacity": format_bytes(obs.capacity) if obs.bound else "-",  # no runtime: no cache
            # Unknown before the first sync: '-' rather than a number nobody measured.
            "cachedPercentage": (obs.cached_percentage or percentage(obs.cached, obs.ufs_total)) if synced else "-",
            "cacheHitRatio": hit_ratio,
            # Local: in-process cache, short-circuit reads, workers on the reader's node.
            "localHitRatio": percentage(obs.hits - obs.remote_hits, total),
            "remoteHitRatio": percentage(obs.remote_hits, total),
            "lastTraceCached": percentage(*obs.trace) if obs.trace and synced else "-",
        },
    }


def runtime_status(desired: int, workers: list[dict], problem: str = "") -> dict:
    """The runtime's ``status`` from its ``desired`` worker count and the observed workers (dicts
    with ``ready`` (bool), ``capacity`` and ``used`` in bytes, and optionally ``name`` and
    ``unhealthyTiers``: see :func:`tier_condition`). ``problem``: why the runtime cannot work at
    all (e.g. a ThinRuntime's missing profile or plugin): phase Failed, with a condition."""
    ready = sum(1 for w in workers if w.get("ready"))
    if problem:
        phase = "Failed"
    elif desired and ready == desired:
        phase = "Ready"
    elif ready:
        phase = "PartialReady"
    else:
        phase = "NotReady"
    tiers = tier_condition(workers)
    return {
        "phase": phase,
        "desiredWorkers": desired,
        "readyWorkers": ready,
        "cacheCapacity": format_bytes(sum(w.get("capacity", 0) for w in workers)),
        "cached": format_bytes(sum(w.get("used", 0) for w in workers)),
        "workers": workers,
        "conditions": [{"type": "Ready", "status": "True" if phase == "Ready" else "False",
                        "reason": "RuntimeFailed" if problem else phase, "message": problem or
                        f"{ready} of {desired} worker(s) ready", "lastTransitionTime": now_iso()},
                       *([tiers] if tiers else [])],
    }


def tier_condition(workers: list[dict]) -> dict | None:
    """Condition ``CacheTiersHealthy`` from the workers that report their disk levels (key
    ``unhealthyTiers``: a list of ``{"medium", "path"}``, and ``reason`` where known, of levels
    that refuse writes, whose reads go to the UFS); None when no worker reports them. False
    (reason ``TierUnhealthy``) names each such worker and directory."""
    reporting = [w for w in workers if "unhealthyTiers" in w]
    if not reporting:
        return None
    tiers = [(w, t) for w in reporting for t in w["unhealthyTiers"]]
    bad = [f"worker {w.get('name', '?')}: {t['medium']} tier {t['path']}"
           + (f" ({t['reason']})" if t.get("reason") else "") for w, t in tiers]
    if bad:
        status, reason = "False", "TierUnhealthy"
        message = "cache tier cannot be written, the blocks it would hold are read from the UFS: " + "; ".join(bad)
        if any(not t.get("reason") for _, t in tiers):  # else each tier's reason says its fix
            message += ": make the directory writable by the worker's uid (README: cache directories on the node)"
    else:
        status, reason, message = "True", "TiersHealthy", f"the cache tiers of {len(reporting)} worker(s) take writes"
    return {"type": "CacheTiersHealthy", "status": status, "reason": reason, "message": message,
            "lastTransitionTime": now_iso()}


def client_runtime_status(runtime) -> dict:
    """The status of a runtime whose clients run in the readers' pods (a JuiceFSRuntime on
    Kubernetes): phase Ready once its children are rendered, ``cacheCapacity`` the disk levels'
    quotas per client, no worker counts (there are no workers to count)."""
    store = runtime.spec.tieredstore
    capacity = sum(lv.quota_bytes for lv in (store.levels if store else []) if lv.mediumtype != "MEM")
    return {"phase": "Ready", "cacheCapacity": format_bytes(capacity),
            "conditions": [{"type": "Ready", "status": "True", "reason": "Rendered",
                            "message": "its JuiceFS clients run in the FUSE sidecars and DataLoad Jobs of its dataset",
                            "lastTransitionTime": now_iso()}]}


IN_PROCESS_NOTE = (
    "in-process cache: replicas 0 and 1 run no worker processes, each reading process caches")


def in_process_status(replicas: int, cache: dict, problem: str = "") -> dict:
    """The status of an embedded runtime with ``replicas`` 0 or 1: no worker processes, the reading
    process's own tiered store (``cache``: ``ready``, ``capacity``/``used`` bytes) caches. 0 and 1
    mean the same there, so both are Ready with that cache's figures; ``readyWorkers`` is
    ``replicas`` when the cache is ready (the in-process cache stands for the one worker)."""
    status = runtime_status(replicas, [cache], problem)
    if not problem and cache.get("ready"):
        status["phase"] = "Ready"
        status["readyWorkers"] = replicas
        status["conditions"][0].update(status="True", reason="InProcess", message=IN_PROCESS_NOTE)
    return status


def keep_transition_times(status: dict, previous: dict) -> dict:
    """``status`` with each condition's ``lastTransitionTime`` taken from ``previous`` (the stored
    status) when a condition of the same type had the same ``status`` there: as in Kubernetes, the
    time says when the condition last changed, not when it was last computed."""
    before = {c.get("type"): c for c in previous.get("conditions") or []}
    for cond in status.get("conditions") or []:
        old = before.get(cond.get("type"))
        if old and old.get("status") == cond.get("status") and old.get("lastTransitionTime"):
            cond["lastTransitionTime"] = old["lastTransitionTime"]
    return status


def dataload_status(result, started_iso: str) -> dict:
    """The DataLoad's ``status`` from a ``dataload.WarmupResult``: phase Complete, Failed, or
    Cancelled (stopped by the user; its condition says how to resume)."""
    failed = [t.path for t in result.targets if t.phase != "Complete"]
    if result.ok:
        condition = ("True", "Complete", "every target's current version is 100% cached")
    elif result.cancelled:
        condition = ("False", "Cancelled", f"cancelled: {format_bytes(result.total('cached_bytes'))} of "
                     f"{format_bytes(result.total('bytes'))} cached, blocks loaded so far stay cached; run it again to "
                     "load the rest")
    else:
        condition = ("False", "TargetsIncomplete", "not completely cached: " + ", ".join(failed))
    return {
        "phase": result.phase,
        "duration": f"{result.duration:.1f}s",
        "conditions": [{"type": "Complete", "status": condition[0], "reason": condition[1],
                        "message": condition[2], "lastTransitionTime": now_iso()}],
        "targets": [
            {"path": t.path, "files": t.files, "bytes": t.bytes, "cachedBytes": t.cached_bytes,
             "phase": t.phase, "failures": t.failures}
            for t in result.targets
        ],
        "lastScheduleTime": started_iso,
        **({"lastSuccessfulTime": now_iso()} if result.ok else {}),
    }
