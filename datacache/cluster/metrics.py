"""A cache worker's Prometheus metrics, and reading them back on the client side.

Counters that the store and block source already keep (bytes cached, capacity, evictions, UFS
bytes) are read when scraped (a custom collector), so the read path does no extra bookkeeping;
request counters and latency histograms are the usual prometheus-client objects, in a registry of
the worker's own (one process may host several workers in tests and benchmarks).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TIER_HEALTHY = "datacache_worker_tier_healthy"
"""Gauge per disk level (labels ``medium``, ``path``: the worker's directory): 1 or 0."""
_LATENCY_BUCKETS = (.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10)


class _StoreCollector:
    """Scrape-time values of a worker's tiered store and block source."""

    def __init__(self, worker):
        self._w = worker

    def collect(self):
        store, source = self._w.store, self._w.source
        used = GaugeMetricFamily("datacache_worker_cached_bytes", "Bytes held by each cache level", labels=["medium"])
        cap = GaugeMetricFamily("datacache_worker_capacity_bytes", "Quota of each cache level", labels=["medium"])
        for level in store.usage():
            used.add_metric([level.medium], level.used)
            cap.add_metric([level.medium], level.quota)
        yield used
        yield cap
        yield GaugeMetricFamily("datacache_worker_used_bytes",
                                "Bytes held by the level blocks are written to (first disk level)",
                                value=store.used())
        yield GaugeMetricFamily("datacache_worker_total_capacity_bytes",
                                "Capacity of the level blocks are written to (first disk level): its quota, or "
                                "less on a smaller device", value=store.capacity)
        yield CounterMetricFamily("datacache_worker_evictions", "Blocks evicted by the watermarks",
                                  value=sum(getattr(lv, "evictions", 0) for lv in store.levels))
        yield CounterMetricFamily("datacache_worker_corrupt_blocks", "Blocks dropped for a bad checksum (refetched)",
                                  value=sum(getattr(lv, "corrupt", 0) for lv in store.levels))
        yield GaugeMetricFamily("datacache_worker_disk_healthy", "1 while every disk level takes writes, else 0",
                                value=int(all(getattr(lv, "healthy", True) for lv in store.levels)))
        tiers = GaugeMetricFamily(TIER_HEALTHY, "1 while this disk level takes writes, else 0 (its reads go to "
                                  "the UFS)", labels=["medium", "path"])
        for level in store.levels:
            if hasattr(level, "healthy"):
                tiers.add_metric([level.medium, level.path], int(level.healthy))
        yield tiers
        yield CounterMetricFamily("datacache_worker_ufs_bytes", "Bytes read from the UFS", value=source.ufs_bytes)
        yield CounterMetricFamily("datacache_worker_peer_bytes", "Bytes copied from other workers (read-repair, "
                                  "hand-off)", value=self._w.peer_bytes)


class WorkerMetrics:
    """Metrics of one worker (``worker`` has ``store`` and ``source`` attributes)."""

    def __init__(self, worker):
        self.registry = CollectorRegistry(auto_describe=True)
        self.hits = Counter("datacache_worker_hits", "Block GETs served from the store", registry=self.registry)
        self.misses = Counter("datacache_worker_misses", "Block GETs filled from the UFS", registry=self.registry)
        self.fills_in_flight = Gauge("datacache_worker_fills_in_flight", "UFS fills running now",
                                     registry=self.registry)
        self.latency = Histogram("datacache_worker_request_seconds", "Request latency by endpoint",
                                 ["endpoint"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.registry.register(_StoreCollector(worker))

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)


def parse(text: str) -> dict[str, float]:
    """Sample name -> value from a Prometheus text page; labelled samples of one name are summed
    (histogram buckets are skipped)."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                continue
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values
