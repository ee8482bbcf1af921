"""Cases C1 and C2 per worker, C13/C14 summed over workers: three workers with a 64 MiB SSD quota
each, a 256 MiB dataset, warmed up and read by 8 concurrent readers."""

from __future__ import annotations

import os
import threading

import pytest

from cluster_support import MiB, apply_cluster, block_bytes, stored_keys, worker_dirs
from datacache.api.quantity import format_bytes
from test_cache_quota import DuSampler

NAME = "quota"
QUOTA, BLOCK = 64 * MiB, 4 * MiB
LEVELS = [{"mediumtype": "SSD", "path": "cache", "quota": "64Mi", "high": 0.95, "low": 0.80}]
FILES = {f"f{i:03d}.bin": 4 * MiB for i in range(64)}


def _sample(home) -> list[DuSampler]:
    """One sampler of the bytes on disk per worker cache directory, started."""
    samplers = [DuSampler(d) for d in worker_dirs(home, NAME).values()]
    for s in samplers:
        s.start()
    return samplers


def _check_peaks(samplers: list[DuSampler]) -> None:
    """Stop the samplers; no worker's directory ever held more than its quota plus one block."""
    for s in samplers:
        s.stop()
    for s in samplers:
        assert s.samples > 5
        assert s.peak <= QUOTA + BLOCK, f"{s.path} reached {s.peak} bytes"


@pytest.fixture(scope="module")
def cluster(module_home, tmp_path_factory):
    src = tmp_path_factory.mktemp("src")
    for name, size in FILES.items():
        (src / name).write_bytes(os.urandom(size))
    plane = apply_cluster(module_home, NAME, [{"name": "local", "mountPoint": str(src)}], LEVELS,
                          block_size="4Mi")
    yield plane, src
    plane.close()


def test_c1_c13_c14_warmup_past_the_summed_quota(cluster, module_home):
    plane, _ = cluster
    client = plane.open_dataset(NAME)
    samplers = _sample(module_home)
    try:
        _, result = plane.warmup(NAME, ["/"])
    finally:
        _check_peaks(samplers)
    (target,) = result.targets
    assert target.phase == "Failed" and any("quota" in f for f in target.failures)  # C1/C13: reported

    expected = block_bytes(client.manifest, BLOCK, NAME)
    stored = stored_keys(module_home, NAME)
    on_workers = sum(size for key, size in expected.items() if any(key in s for s in stored.values()))
    assert 0 < on_workers < 256 * MiB
    assert target.cached_bytes == client.cached_bytes() == on_workers  # C14: summed over workers
    status = plane.refresh_status("Dataset", NAME)
    assert status["cacheStates"]["cached"] == format_bytes(on_workers)
    assert status["cacheStates"]["cachedPercentage"] == f"{1000 * on_workers // (256 * MiB) / 10:.1f}%"
    assert status["cacheStates"]["cacheCapacity"] == format_bytes(3 * QUOTA)
    metrics = client.source.worker_metrics()
    assert sum(m["datacache_worker_evictions_total"] for m in metrics.values()) > 0
    for keys in stored.values():
        assert sum(expected.get(k, 0) for k in keys) <= 0.95 * QUOTA  # at most the high watermark
    client.close()


def test_c2_eight_concurrent_readers_hold_each_workers_quota(cluster, module_home):
    plane, src = cluster
    client = plane.open_dataset(NAME)
    client.source.drop()
    names = sorted(FILES)
    sums, errors = {}, []

    def reader(mine):
        try:
            for name in mine:
                with client.open(name) as f:
                    sums[name] = f.read()
        except Exception as err:  # surfaced below
            errors.append(err)

    samplers = _sample(module_home)
    threads = [threading.Thread(target=reader, args=(names[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _check_peaks(samplers)
    assert not errors
    for name in names:
        assert sums[name] == (src / name).read_bytes()
    client.close()
