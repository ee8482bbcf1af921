"""What the workers report: capacity and used bytes from each worker's Prometheus ``/metrics``.

``datacache_worker_total_capacity_bytes`` and ``datacache_worker_used_bytes`` are the gauges a
worker exports (:mod:`datacache.cluster.metrics`); the same figures feed the runtime's status
(``cacheCapacity``, ``cached``, the ``CacheTiersHealthy`` condition) and the autoscale policy's
capacity-used rate.
"""

from __future__ import annotations

import asyncio

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from datacache.cluster.metrics import TIER_HEALTHY
from datacache.control.autoscale import WorkerMetrics

_TIMEOUT = aiohttp.ClientTimeout(total=3.0)


def parse(text: str, name: str) -> WorkerMetrics:
    """A worker's figures (bytes) from its metrics page ``text``; absent gauges count as 0. Disk
    levels whose :data:`TIER_HEALTHY` gauge is 0 become ``unhealthy_tiers`` (medium, path)."""
    values: dict[str, float] = {}
    unhealthy = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = sample.value
            if sample.name == TIER_HEALTHY and not sample.value:
                unhealthy.append((sample.labels["medium"], sample.labels["path"]))
    return WorkerMetrics(name=name, capacity=int(values.get("datacache_worker_total_capacity_bytes", 0)),
                         used=int(values.get("datacache_worker_used_bytes", 0)), unhealthy_tiers=tuple(unhealthy))


def status_entry(metrics: WorkerMetrics) -> dict:
    """A ready worker's entry in the runtime's ``status.workers`` (what
    :func:`datacache.control.reconcile.runtime_status` reads): name, capacity and used bytes, and
    ``unhealthyTiers`` (``{"medium", "path"}`` of each disk level refusing writes)."""
    return {"name": metrics.name, "ready": True, "capacity": metrics.capacity, "used": metrics.used,
            "unhealthyTiers": [{"medium": medium, "path": path} for medium, path in metrics.unhealthy_tiers]}


async def scrape(endpoints: list[tuple[str, str]]) -> list[WorkerMetrics]:
    """Figures of the workers at ``endpoints`` (name, ``http://host:port``); a worker that does not
    answer within 3 seconds is left out (it is not ready)."""
    async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
        async def one(name: str, url: str) -> WorkerMetrics | None:
            try:
                async with session.get(f"{url}/metrics") as resp:
                    resp.raise_for_status()
                    return parse(await resp.text(), name)
            except (aiohttp.ClientError, asyncio.TimeoutError):
                return None

        found = await asyncio.gather(*(one(name, url) for name, url in endpoints))
    return [m for m in found if m is not None]
