"""What the control plane observes of a runtime's workers, for ``datacache get runtimes``.

Each registered worker is asked for its ``/metrics`` (no token needed: metrics carry no data);
a worker that answers is ready, and its capacity and use are what its store reports now, not
what it reported at its last heartbeat. Desired workers that have not registered are listed as
not ready, so DESIRED/READY tell the whole story.
"""

from __future__ import annotations

from datacache.cluster.membership import open_membership
from datacache.cluster import workerset


def observe_workers(home: str, runtime) -> list[dict]:
    """One dict per worker of CacheRuntime ``runtime`` (a model): ``name``, ``ready`` (bool),
    ``capacity`` and ``used`` (bytes), ``hits``, ``misses``, ``url``, ``pid``."""
    from datacache.cluster.worker_client import LoopThread, WorkerClient  # aiohttp: not for in-process runtimes

    ns, name = runtime.metadata.namespace, runtime.metadata.name
    members = open_membership(home)
    try:
        found = {m.index: m for m in members.live(ns, name)}
    finally:
        members.close()
    client = WorkerClient("", name, runtime.spec.block_size_bytes, read_timeout=5.0)
    io = LoopThread("datacache-status")
    try:
        listed = sorted(found.values(), key=lambda m: m.index)
        jobs = [client.metrics(m.url, m.worker_id) for m in listed]
        answers = dict(zip((m.index for m in listed), io.gather(jobs)))
        io.run(client.close())
    finally:
        io.close()
    workers = []
    for i in sorted(set(workerset.desired(home, ns, name, runtime.spec.replicas)) | set(found)):
        sample = answers.get(i)
        member = found.get(i)
        ok = isinstance(sample, dict)
        workers.append({
            "name": f"{name}-worker-{i}", "ready": ok,
            "capacity": int(sample.get("datacache_worker_total_capacity_bytes", 0)) if ok else 0,
            "used": int(sample.get("datacache_worker_used_bytes", 0)) if ok else 0,
            "hits": int(sample.get("datacache_worker_hits_total", 0)) if ok else 0,
            "misses": int(sample.get("datacache_worker_misses_total", 0)) if ok else 0,
            "url": member.url if member else "", "pid": member.pid if member else 0,
        })
    return workers
