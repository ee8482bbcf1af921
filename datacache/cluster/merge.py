"""Merging workers' caches into one: what scaling a runtime back to one replica does with them.

With one replica the cache lives in the reading process again (one directory per disk level,
``<level path>/<ns>/<name>``). One worker's directory becomes that cache by renames
(:func:`datacache.control.supervisor.return_cache`); every other worker's blocks of the dataset's
current files are then copied into it here (each block read through its checksum, so a corrupt
one is dropped, not copied), bounded by the level's quota: the copy stops short of the high
watermark instead of evicting blocks it just kept. A copied block is deleted from the worker's
directory; what could not be copied stays there (used again if that worker comes back) and is
reported with the reason, like a drain (:meth:`datacache.cluster.peers.Peers.drain`).
"""

from __future__ import annotations

import os
import time

from datacache.api.quantity import format_bytes
from datacache.cache.blocks import BlockKey
from datacache.cache.disk import DiskTier, holds_cache
from datacache.cluster.store import ServingDiskTier


def merge_into(target: DiskTier, limit: int, source: str, dataset: str, current: set[str] | None) -> dict:
    """Copy the blocks of ``dataset``'s ``current`` file ids (None: every block) held in the cache
    directory ``source`` into ``target`` while ``target.used()`` stays within ``limit`` bytes,
    deleting each from ``source`` once ``target`` holds it (both must be closed to writers, the
    workers stopped).

    Returns ``{"blocks": n current blocks found, "moved": n held by target now, "dropped": n that
    failed their checksum, "left": n still in source, "stale": n blocks of other versions not
    copied, "seconds": elapsed, "full": the limit as text when it stopped the copy, else ''}``.
    Raises ``OSError`` when ``source`` cannot be opened."""
    started = time.monotonic()
    tier = ServingDiskTier(source, 1 << 62)  # the quota only bounds writes: none here
    try:
        prefix = f"{dataset}/"
        keys = [k for k in tier.keys() if k.startswith(prefix)]
        wanted = [k for k in keys if current is None or BlockKey.parse(k).file_id in current]
        counts = {"moved": 0, "dropped": 0, "left": 0}
        for key in wanted:
            outcome = _copy(tier, target, limit, key)
            counts[outcome] += 1
            if outcome == "moved":
                tier.discard(key)
    finally:
        tier.close()
    return {"blocks": len(wanted), **counts, "stale": len(keys) - len(wanted),
            "seconds": round(time.monotonic() - started, 3), "full": format_bytes(limit) if counts["left"] else ""}


def _copy(source: DiskTier, target: DiskTier, limit: int, key: str) -> str:
    """Copy one block: ``moved`` (``target`` holds it now), ``dropped`` (corrupt, deleted by the
    tier's checksum check) or ``left`` (``target`` is full)."""
    if key in target:
        return "moved"
    data = source.get(key)
    if data is None:
        return "dropped"
    if target.used() + len(data) > limit or not target.put(key, data):
        return "left"
    return "moved"


def summary(worker: str, report: dict) -> str:
    """One line for a :func:`merge_into` report (per worker), e.g. ``copied worker-0: 40/40
    blocks into the in-process cache in 0.2s`` plus what was left or dropped and why."""
    line = (f"copied {worker}: {report['moved']}/{report['blocks']} blocks into the in-process cache in "
            f"{report['seconds']:.1f}s")
    if report["left"]:
        line += (f"; {report['left']} left in its cache directory (the in-process cache is at the high "
                 f"watermark of its quota, {report['full']})")
    if report["dropped"]:
        line += f"; {report['dropped']} dropped (they failed their checksum)"
    if report["stale"]:
        line += f"; {report['stale']} blocks of old file versions not copied"
    return line


def worker_dirs(base: str) -> list[str]:
    """The workers' cache directories (``worker-<i>`` with a cache) under a level directory ``base``,
    by name."""
    if not os.path.isdir(base):
        return []
    return sorted(e for e in os.listdir(base)
                  if e.startswith("worker-") and holds_cache(os.path.join(base, e)))
