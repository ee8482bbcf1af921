"""With real worker processes: scale-in stops the least hot worker the autoscale decision names (not
the highest-numbered one) while readers check every byte, and scaling N -> 1 keeps one worker's
blocks as the in-process cache (cachedPercentage before/after against the stored blocks)."""

from __future__ import annotations

import hashlib
import threading

from cluster_support import apply_cluster, block_bytes, live, open_client, stored_keys, write_files
from datacache.api.models import AutoscalePolicy
from datacache.api.quantity import format_bytes
from datacache.cache.blocks import file_id
from datacache.cluster import placement
from datacache.control import workerset
from datacache.control.controller import Controller
from datacache.control.reconcile import percentage

KiB = 1024
BS = 64 * KiB


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read(client, rel: str) -> bytes:
    with client.open(rel) as f:
        return f.read()


def owners(plane, name: str, ids: list[str]) -> dict[str, str]:
    """Dataset path (one-block files) -> the worker owning its block among ``ids``."""
    return {e.path: placement.owners(f"{name}/{file_id(e.mount, e.ufs_path, e.version, BS)}/0", ids)[0]
            for e in plane.load_manifest(plane.get("Dataset", name))}


def test_scale_in_stops_the_least_hot_worker_while_reads_stay_right(workers_home, tmp_path):
    files = write_files(tmp_path / "src", {f"{i:02d}.bin": BS for i in range(24)})  # one block each
    plane = apply_cluster(workers_home, "cool", [{"name": "local", "mountPoint": str(tmp_path / "src")}],
                          replicas=3, block_size="64Ki")
    _, result = plane.warmup("cool", [])
    assert result.ok
    owner = owners(plane, "cool", ["worker-0", "worker-1", "worker-2"])
    hot = [p for p, w in owner.items() if w != "worker-0"]
    assert len(hot) < len(owner)  # worker-0 holds some blocks, but nobody reads them

    runtime = plane.get("CacheRuntime", "cool")
    runtime.spec.autoscale = AutoscalePolicy(min_replicas=2, max_replicas=3, target_used_ratio=0.9, cooldown=0,
                                             scale_down="Gated")
    plane.apply([runtime])
    ctl = Controller(plane)
    ctl.metrics(plane.get("CacheRuntime", "cool"))  # the hit window starts now
    http = open_client(plane, "cool", short_circuit=False)  # every hit is counted by a worker
    for _ in range(3):
        for rel in hot:
            assert read(http, rel) == files[rel]

    stop, errors, checked = threading.Event(), [], [0]

    def reader(client, names):
        try:
            while not stop.is_set():
                for rel in names:
                    if sha(read(client, rel)) != sha(files[rel]):
                        errors.append(f"{rel}: wrong bytes")
                    checked[0] += 1
        except Exception as err:  # any failed read fails the test
            errors.append(repr(err))

    local = plane.open_dataset("cool")
    threads = [threading.Thread(target=reader, args=(local, sorted(files))),
               threading.Thread(target=reader, args=(http, hot))]
    for t in threads:
        t.start()
    try:
        events = ctl.tick()
    finally:
        after = checked[0]
        for rel in sorted(files):  # every file once more, through the remaining workers
            assert read(local, rel) == files[rel]
        stop.set()
        for t in threads:
            t.join(60)
        local.close()
        http.close()
    assert not errors, errors[:5]
    assert after > 0
    assert len(events) == 1 and "scaling in from 3 to 2" in events[0], events
    assert events[0].endswith("(stopped the least hot: cool-worker-0)")
    assert sorted(live(workers_home, "cool")) == ["worker-1", "worker-2"]
    assert workerset.read(str(workers_home), "default", "cool") == [1, 2]
    status = plane.refresh_status("CacheRuntime", "cool")
    assert (status["phase"], status["desiredWorkers"], status["readyWorkers"]) == ("Ready", 2, 2)
    assert [w["name"] for w in status["workers"]] == ["cool-worker-1", "cool-worker-2"]


def test_scaling_to_one_replica_keeps_the_kept_workers_blocks(workers_home, tmp_path):
    files = write_files(tmp_path / "src", {f"{i:02d}.bin": 3 * BS + i for i in range(12)})
    total = sum(len(v) for v in files.values())
    plane = apply_cluster(workers_home, "one", [{"name": "local", "mountPoint": str(tmp_path / "src")}],
                          replicas=2, block_size="64Ki")
    _, result = plane.warmup("one", [])
    assert result.ok
    states = plane.refresh_status("Dataset", "one")["cacheStates"]
    assert states["cachedPercentage"] == "100.0%"
    wanted = block_bytes(plane.load_manifest(plane.get("Dataset", "one")), BS, "one")
    held = {w: sum(wanted[k] for k in keys if k in wanted) for w, keys in stored_keys(workers_home, "one").items()}
    assert held["worker-0"] > 0 and held["worker-1"] > 0 and sum(held.values()) == total

    line = plane.scale("one", 1, remove=("one-worker-0",))  # keep worker-1's blocks
    assert line == "cacheruntime.datacache.io/one scaled"
    assert live(workers_home, "one") == {}
    states = plane.refresh_status("Dataset", "one")["cacheStates"]
    assert states["cached"] == format_bytes(held["worker-1"])
    assert states["cachedPercentage"] == percentage(held["worker-1"], total)
    client = plane.open_dataset("one")
    try:
        for rel, data in files.items():
            assert read(client, rel) == data
    finally:
        client.close()
    assert plane.refresh_status("Dataset", "one")["cacheStates"]["cachedPercentage"] == "100.0%"

    plane.scale("one", 2)  # and back: the in-process cache becomes a worker's again
    assert sorted(live(workers_home, "one")) == ["worker-0", "worker-1"]
    assert plane.refresh_status("Dataset", "one")["cacheStates"]["cachedPercentage"] == "100.0%"
