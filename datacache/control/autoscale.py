"""Autoscaling decisions for a CacheRuntime: one pure function shared by the embedded control plane
(which starts/stops workers) and the Kubernetes operator (which writes the scale subresource).

The input is each ready worker's capacity and used bytes; the capacity-used rate is
``Σ used / Σ capacity`` (the same rate as Fluid's ``cacheCapacity``/``cached`` columns). Nothing
here reads clocks or files: ``now`` and the time of the last scaling come from the caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..api.models import AutoscalePolicy

__all__ = ["WorkerMetrics", "ScaleDecision", "used_ratio", "low_since", "decide"]


@dataclass(frozen=True)
class WorkerMetrics:
    """One ready worker's figures: ``capacity`` and ``used`` in bytes, and ``hot_bytes`` read from
    it in the last window (bytes; used to pick scale-in victims, least hot first)."""

    name: str
    capacity: int
    used: int
    hot_bytes: int = 0
    unhealthy_tiers: tuple[tuple[str, str], ...] = ()  # (medium, path) of disk levels that refuse writes


@dataclass(frozen=True)
class ScaleDecision:
    """The desired worker count, a one-line ``reason`` for events/status, and on scale-in the
    workers to remove (least hot data first; ``len(remove) == current - replicas`` when known)."""

    replicas: int
    reason: str
    remove: tuple[str, ...] = ()


def used_ratio(workers: Sequence[WorkerMetrics]) -> float:
    """Capacity-used rate ``Σ used / Σ capacity`` in [0, 1+]; 0.0 when no capacity is known."""
    capacity = sum(w.capacity for w in workers)
    return sum(w.used for w in workers) / capacity if capacity > 0 else 0.0


def low_since(policy: AutoscalePolicy, workers: Sequence[WorkerMetrics], now: float,
              previous: float | None) -> float | None:
    """Track since when (seconds, the caller's clock) the rate has stayed below
    ``target_used_ratio - scale_down_margin``: ``previous`` if it still is (or ``now`` when it just
    went below), None once it is not. Feed the result back on the next call and to :func:`decide`."""
    if workers and used_ratio(workers) < policy.target_used_ratio - policy.scale_down_margin:
        return now if previous is None else previous
    return None


def _victims(workers: Sequence[WorkerMetrics], count: int) -> tuple[str, ...]:
    # Least hot data first, then least cached bytes: removing them loses the fewest future hits.
    ranked = sorted(workers, key=lambda w: (w.hot_bytes, w.used, w.name))
    return tuple(w.name for w in ranked[:count])


def decide(policy: AutoscalePolicy, current: int, workers: Sequence[WorkerMetrics],
           now: float, last_scale_time: float | None, *,
           below_since: float | None = None) -> ScaleDecision:
    """Desired replicas for a runtime running ``current`` workers, of which ``workers`` are ready.

    Rules, in order: keep ``current`` within [min_replicas, max_replicas] (at once, no cooldown);
    within ``cooldown`` seconds of ``last_scale_time`` hold; above ``target_used_ratio`` add
    ``scale_up_step`` workers (capped at max); with ``scale_down: Gated``, remove one worker (the
    least hot) when the rate has been below ``target - scale_down_margin`` since ``below_since``
    for a whole cooldown (see :func:`low_since`) and the remaining capacity would still hold the
    used bytes below the target. Otherwise hold. Never raises for valid inputs.
    """
    lo, hi = policy.min_replicas, policy.max_replicas
    if current < lo:
        return ScaleDecision(lo, f"{current} worker(s) is below minReplicas {lo}")
    if current > hi:
        return ScaleDecision(hi, f"{current} worker(s) is above maxReplicas {hi}",
                             _victims(workers, current - hi))
    if not workers:
        return ScaleDecision(current, "no ready worker reports metrics yet")
    ratio = used_ratio(workers)
    shown = f"capacity used {ratio:.0%} (target {policy.target_used_ratio:.0%})"
    if last_scale_time is not None and now - last_scale_time < policy.cooldown:
        left = policy.cooldown - (now - last_scale_time)
        return ScaleDecision(current, f"{shown}; cooling down for {left:.0f}s more")
    if ratio > policy.target_used_ratio:
        if current >= hi:
            return ScaleDecision(current, f"{shown}; already at maxReplicas {hi}")
        desired = min(hi, current + policy.scale_up_step)
        return ScaleDecision(desired, f"{shown}; scaling out from {current} to {desired}")
    if policy.scale_down != "Gated" or current <= lo:
        return ScaleDecision(current, shown)
    gate = policy.target_used_ratio - policy.scale_down_margin
    if below_since is None or now - below_since < policy.cooldown or ratio >= gate:
        return ScaleDecision(current, f"{shown}; scale-in needs below {gate:.0%} for {policy.cooldown:g}s")
    victim = _victims(workers, 1)
    kept = [w for w in workers if w.name not in victim]
    kept_capacity = sum(w.capacity for w in kept)
    used = sum(w.used for w in workers)
    if kept_capacity <= 0 or used / kept_capacity > policy.target_used_ratio:
        return ScaleDecision(current, f"{shown}; fewer workers could not hold the cached bytes")
    return ScaleDecision(current - 1, f"{shown}; scaling in from {current} to {current - 1}", victim)
