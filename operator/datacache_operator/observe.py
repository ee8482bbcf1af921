"""What the workers report: capacity and used bytes from each worker's Prometheus ``/metrics``.

``datacache_worker_total_capacity_bytes`` and ``datacache_worker_used_bytes`` are the gauges a
worker exports (:mod:`datacache.cluster.metrics`); the same figures feed the runtime's status
(``cacheCapacity``, ``cached``) and the autoscale policy's capacity-used rate.
"""

from __future__ import annotations

import asyncio

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from datacache.control.autoscale import WorkerMetrics

_TIMEOUT = aiohttp.ClientTimeout(total=3.0)


def parse(text: str, name: str) -> WorkerMetrics:
    """A worker's figures (bytes) from its metrics page ``text``; absent gauges count as 0."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = sample.value
    return WorkerMetrics(name=name, capacity=int(values.get("datacache_worker_total_capacity_bytes", 0)),
                         used=int(values.get("datacache_worker_used_bytes", 0)))


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
