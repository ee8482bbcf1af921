"""Dataset and runtime status from the truth: cached bytes against the blocks really stored,
no credentials needed, empty and unsynced datasets, failed ThinRuntimes, the index scan's speed."""

from __future__ import annotations

import os
import time

from datacache.api.loader import load_resources
from datacache.api.quantity import format_bytes
from datacache.cache.blocks import BlockKey, block_count, block_range, file_id
from datacache.control import observe, reconcile
from datacache.manifest import FileEntry, Manifest
from support import apply_dataset, s3_mount

BS = 64 * 1024


def stored_block_bytes(plane, name: str) -> int:
    """Bytes of the dataset's current-version blocks, counted block by block from the store."""
    runtime = plane.get("CacheRuntime", name)
    store = plane.store_for(runtime)
    manifest = plane.load_manifest(plane.get("Dataset", name))
    try:
        total = 0
        for e in manifest:
            fid = file_id(e.mount, e.ufs_path, e.version, BS)
            for i in range(block_count(e.size, BS)):
                if str(BlockKey(name, fid, i)) in store:
                    start, end = block_range(i, e.size, BS)
                    total += end - start
        return total
    finally:
        store.close()


def test_cached_counts_current_versions_only(datacache_home, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    sizes = {"a.bin": 3 * BS + 100, "b.bin": BS, "c.bin": 10, "d/e.bin": 2 * BS}
    for rel, size in sizes.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(os.urandom(size))
    plane = apply_dataset(datacache_home, "ds", [{"name": "local", "mountPoint": str(src)}], block_size="64Ki")
    status = plane.refresh_status("Dataset", "ds")
    assert status["cacheStates"]["cached"] == "0B" and status["cacheStates"]["cachedPercentage"] == "0.0%"

    _, result = plane.warmup("ds", ["/a.bin", "/c.bin"])
    assert result.ok
    status = plane.refresh_status("Dataset", "ds")
    held = sizes["a.bin"] + sizes["c.bin"]
    assert stored_block_bytes(plane, "ds") == held
    assert status["cacheStates"]["cached"] == format_bytes(held)
    assert status["cacheStates"]["cachedPercentage"] == f"{1000 * held // sum(sizes.values()) / 10:.1f}%"
    assert status["phase"] == "Bound" and status["fileNum"] == 4

    client = plane.open_dataset("ds")  # 4 blocks held (hits), then 1 not held (a miss)
    try:
        for rel in ("a.bin", "b.bin"):
            with client.open(rel) as f:
                assert f.read() == (src / rel).read_bytes()
    finally:
        client.close()
    states = plane.refresh_status("Dataset", "ds")["cacheStates"]
    assert (states["cacheHitRatio"], states["localHitRatio"], states["remoteHitRatio"]) == ("80.0%", "80.0%", "0.0%")

    (src / "a.bin").write_bytes(os.urandom(sizes["a.bin"] + 1))  # a new version: old blocks stop counting
    os.utime(src / "a.bin", (1, 1))
    plane.sync("ds")
    status = plane.refresh_status("Dataset", "ds")
    still = sizes["b.bin"] + sizes["c.bin"]  # b.bin was cached by the read above
    assert stored_block_bytes(plane, "ds") == still
    assert status["cacheStates"]["cached"] == format_bytes(still)


def test_empty_and_unsynced_datasets_are_not_100_percent(datacache_home, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    plane = apply_dataset(datacache_home, "empty", [{"name": "local", "mountPoint": str(empty)}])
    states = plane.refresh_status("Dataset", "empty")["cacheStates"]
    assert (states["cachedPercentage"], states["cacheHitRatio"]) == ("0.0%", "0.0%")
    unsynced = reconcile.dataset_status(reconcile.DatasetObservation(bound=True, synced=False))
    assert unsynced["phase"] == "Pending" and unsynced["cacheStates"]["cachedPercentage"] == "-"


def test_status_needs_no_ufs_credentials(datacache_home, s3_bucket, moto_server, moto_secrets, monkeypatch):
    fs, bucket = s3_bucket
    fs.pipe(f"{bucket}/x.bin", b"x" * 1000)
    plane = apply_dataset(datacache_home, "s3ds", [s3_mount(moto_server, bucket)])
    _, result = plane.warmup("s3ds", [])
    assert result.ok
    monkeypatch.delenv("DATACACHE_SECRET_MOTO_KEY")
    monkeypatch.delenv("DATACACHE_SECRET_MOTO_SECRET")
    [doc] = plane.list("Dataset")
    assert doc["status"]["phase"] == "Bound", doc["status"]["conditions"]
    assert doc["status"]["cacheStates"]["cached"] == "1000B"
    assert doc["status"]["cacheStates"]["cachedPercentage"] == "100.0%"


def test_failed_thin_runtime_is_not_ready(datacache_home, tmp_path):
    path = tmp_path / "thin.yaml"
    path.write_text("""apiVersion: datacache.io/v1alpha1
kind: ThinRuntimeProfile
metadata: {name: ghost}
spec: {fileSystemType: ghostfs, plugin: not-installed-plugin}
---
apiVersion: datacache.io/v1alpha1
kind: ThinRuntime
metadata: {name: thin}
spec:
  profileName: ghost
  tieredstore: {levels: [{mediumtype: MEM, quota: 16Mi}]}
""")
    from datacache.control.embedded import Embedded

    plane = Embedded(str(datacache_home))
    plane.apply(load_resources(path))
    status = plane.refresh_status("ThinRuntime", "thin")
    assert status["phase"] == "Failed" and status["readyWorkers"] == 0
    assert "plugin 'not-installed-plugin' is not installed" in status["conditions"][0]["message"]


def test_index_scan_is_fast_for_many_files():
    n, bs = 200_000, 4 << 20
    manifest = Manifest.from_entries(FileEntry(f"/f{i}", "m", f"f{i}", 1000 + i, 0.0, f"v{i}") for i in range(n))
    keys = [f"ds/{file_id('m', f'f{i}', f'v{i}', bs)}/0" for i in range(0, n, 2)]
    started = time.perf_counter()
    cached = observe.cached_bytes(manifest, set(keys + ["other/x/0"]), "ds", bs)
    elapsed = time.perf_counter() - started
    assert cached == sum(1000 + i for i in range(0, n, 2))
    assert elapsed < 5.0, f"{elapsed:.1f}s for {n} files"
