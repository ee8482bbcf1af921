"""localHitRatio / remoteHitRatio of a runtime with real worker processes, against a controlled read
pattern: a reader on the workers' node (short-circuit: local hits), a reader that routes as if it ran
on another node (every hit served over the network by a remote worker), and cold blocks (misses)."""

from __future__ import annotations

import os

from cluster_support import MiB, apply_cluster, worker_metrics, write_files
from datacache.cache.budget import MemoryBudget
from datacache.cache.readahead import ReadAhead
from datacache.cache.stats import HitStats
from datacache.cluster import auth
from datacache.cluster.worker_client import WorkerClient
from datacache.cluster.membership import open_membership
from datacache.cluster.routing import Router
from datacache.cluster.worker_source import ClusterBlockSource

KiB = 1024
BS = 64 * KiB


def read(client, rel: str) -> bytes:
    with client.open(rel) as f:
        return f.read()


def reader_on_another_node(plane, home, name: str):
    """A DatasetClient whose router believes it runs on node ``elsewhere``: no short-circuit, and
    each hit counts as served by a remote worker (as for a reader on another machine)."""
    client = plane.open_dataset(name)
    client.source.close()
    runtime = plane.get("CacheRuntime", name)
    workers = WorkerClient(auth.load_token(str(home), "default", name), name, runtime.spec.block_size_bytes,
                           1.0, 10.0)
    router = Router(open_membership(str(home)), "default", name, node="elsewhere")
    stats = HitStats(os.path.join(str(home), "stats", "default", name))
    client.source = ClusterBlockSource(name, router, workers, client.ufs,
                                       ReadAhead(MemoryBudget(64 * MiB), runtime.spec.block_size_bytes), stats)
    return client


def test_local_and_remote_hit_ratios_count_where_hits_were_served(workers_home, tmp_path):
    files = write_files(tmp_path / "src", {f"{i}.bin": 2 * BS for i in range(5)})  # 2 blocks each
    plane = apply_cluster(workers_home, "hits", [{"name": "local", "mountPoint": str(tmp_path / "src")}],
                          replicas=2, block_size="64Ki")
    _, result = plane.warmup("hits", ["/0.bin", "/1.bin", "/2.bin", "/3.bin"])  # 4.bin stays cold
    assert result.ok
    states = plane.refresh_status("Dataset", "hits")["cacheStates"]
    assert (states["cacheHitRatio"], states["localHitRatio"], states["remoteHitRatio"]) == ("0.0%",) * 3

    here = plane.open_dataset("hits")
    far = reader_on_another_node(plane, workers_home, "hits")
    try:
        # Files in descending order: a scan in name order would read 4.bin's first block ahead
        # (datacache.file_readahead), and it must stay cold here.
        for rel in ("1.bin", "0.bin"):  # 4 blocks from this node's block files: local hits
            assert read(here, rel) == files[rel]
        for rel in ("3.bin", "2.bin"):  # 4 blocks over the network from a remote worker: remote hits
            assert read(far, rel) == files[rel]
        assert read(far, "4.bin") == files["4.bin"]  # 2 cold blocks: misses
    finally:
        here.close()
        far.close()
    states = plane.refresh_status("Dataset", "hits")["cacheStates"]  # 8 hits (4 local, 4 remote) of 10 reads
    assert (states["cacheHitRatio"], states["localHitRatio"], states["remoteHitRatio"]) == ("80.0%", "40.0%", "40.0%")
    # The workers' own counters agree: only the remote reader's 4 hits and 2 misses reached them.
    served = worker_metrics(workers_home, "hits").values()
    assert sum(m["datacache_worker_hits_total"] for m in served) == 4
    assert sum(m["datacache_worker_misses_total"] for m in served) == 2
