"""With real worker processes: status numbers against what 3 workers really store (C14), one
scale-out by the controller when the cache fills past its target, deletion on every worker."""

from __future__ import annotations

import hashlib
import time

from cluster_support import MiB, apply_cluster, block_bytes, stored_keys, write_files
from datacache.api.models import AutoscalePolicy
from datacache.api.quantity import format_bytes
from datacache.control import dataloads
from datacache.control.controller import Controller

KiB = 1024
BS = 64 * KiB


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def held_current_bytes(plane, home, name: str) -> int:
    """Bytes of current-version blocks found in the workers' cache directories (each block once)."""
    wanted = block_bytes(plane.load_manifest(plane.get("Dataset", name)), BS, name)
    on_disk = set().union(*stored_keys(home, name).values())
    return sum(size for key, size in wanted.items() if key in on_disk)


def test_status_counts_blocks_on_three_workers_and_delete_drops_them(workers_home, tmp_path):
    files = write_files(tmp_path / "src", {f"d/{i}.bin": 150 * KiB + i for i in range(12)})
    plane = apply_cluster(workers_home, "tri", [{"name": "local", "mountPoint": str(tmp_path / "src")}],
                          replicas=3, block_size="64Ki")
    _, result = plane.warmup("tri", ["/d/1.bin", "/d/2.bin", "/d/3.bin", "/d/4.bin"])
    assert result.ok
    per_worker = stored_keys(workers_home, "tri")
    assert sum(1 for keys in per_worker.values() if keys) >= 2  # spread over several workers
    held = held_current_bytes(plane, workers_home, "tri")
    assert held == sum(len(files[f"d/{i}.bin"]) for i in (1, 2, 3, 4))
    states = plane.refresh_status("Dataset", "tri")["cacheStates"]
    total = sum(len(v) for v in files.values())
    assert states["cached"] == format_bytes(held)
    assert states["cachedPercentage"] == f"{1000 * held // total / 10:.1f}%"
    runtime = plane.refresh_status("CacheRuntime", "tri")
    assert (runtime["phase"], runtime["desiredWorkers"], runtime["readyWorkers"]) == ("Ready", 3, 3)

    plane.delete("Dataset", "tri")
    assert all(not any(k.startswith("tri/") for k in keys) for keys in stored_keys(workers_home, "tri").values())
    assert plane.state.list("DataLoad") == []
    assert not (workers_home / "datasets" / "default" / "tri").exists()


def test_controller_scales_out_when_the_cache_fills_past_target(workers_home, tmp_path):
    files = write_files(tmp_path / "src", {f"{i}.bin": MiB for i in range(5)})
    plane = apply_cluster(workers_home, "grow", [{"name": "local", "mountPoint": str(tmp_path / "src")}],
                          levels=[{"mediumtype": "SSD", "path": "cache", "quota": "8Mi"}], replicas=2,
                          block_size="64Ki")
    runtime = plane.get("CacheRuntime", "grow")
    runtime.spec.autoscale = AutoscalePolicy(min_replicas=2, max_replicas=3, target_used_ratio=0.25, cooldown=0)
    plane.apply([runtime])
    ctl = Controller(plane)
    assert ctl.tick() == []  # empty cache: below target, nothing to do

    _, result = plane.warmup("grow", [])
    assert result.ok
    metrics = ctl.metrics(plane.get("CacheRuntime", "grow"))
    used = sum(m.used for m in metrics) / sum(m.capacity for m in metrics)
    assert used > 0.25 and len(metrics) == 2
    events = ctl.tick()
    assert len(events) == 1 and "cacheruntime.datacache.io/grow scaled" in events[0], events
    assert "scaling out from 2 to 3" in events[0]
    status = plane.refresh_status("CacheRuntime", "grow")  # keeps the controller's lastScaleTime
    assert (status["phase"], status["desiredWorkers"], status["readyWorkers"]) == ("Ready", 3, 3)
    assert plane.get("CacheRuntime", "grow").spec.replicas == 3
    assert abs(dataloads.parse_iso(status["lastScaleTime"]) - time.time()) < 120

    client = plane.open_dataset("grow")  # reads stay correct across the scale-out
    try:
        for rel, content in files.items():
            with client.open(rel) as f:
                assert sha(f.read()) == sha(content)
    finally:
        client.close()
    assert ctl.tick() == []  # at maxReplicas: holds
