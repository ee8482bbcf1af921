"""Deleting a runtime removes its cache directories: no block outlives the runtime, whatever order
the Dataset and the runtime are deleted in."""

from __future__ import annotations

import os

from support import apply_dataset, du


def test_deleting_the_runtime_first_leaves_no_block_on_disk(datacache_home, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"{i}.bin").write_bytes(os.urandom(300_000))
    plane = apply_dataset(datacache_home, "gone", [{"name": "local", "mountPoint": str(src)}],
                          [{"mediumtype": "SSD", "path": "cache/ssd", "quota": "64Mi"}], block_size="256Ki")
    _, result = plane.warmup("gone", ["/"])
    assert result.ok
    cache_dir = os.path.join(datacache_home, "cache", "ssd", "default", "gone")
    assert du(cache_dir) >= 900_000  # the blocks really are on disk
    assert plane.delete("CacheRuntime", "gone") == "cacheruntime.datacache.io/gone deleted"
    assert not os.path.exists(cache_dir)
    assert plane.delete("Dataset", "gone") == "dataset.datacache.io/gone deleted"
    assert du(os.path.join(datacache_home, "cache")) == 0
    assert plane.list("Dataset") == [] and plane.list("CacheRuntime") == []


def test_deleting_a_runtime_removes_its_file_tier_at_its_own_path_and_the_empty_namespace(datacache_home,
                                                                                        tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(os.urandom(300_000))
    plane = apply_dataset(datacache_home, "ft", [{"name": "local", "mountPoint": str(src)}],
                          [{"mediumtype": "SSD", "path": "cache/ssd", "quota": "64Mi"}], block_size="256Ki")
    runtime = plane.get("CacheRuntime", "ft")
    files = tmp_path / "file-tier"
    runtime.spec.tieredstore.file_tier = runtime.spec.tieredstore.file_tier.model_validate(
        {"path": str(files), "quota": "16Mi"})
    plane.apply([runtime])
    client = plane.open_dataset("ft")
    try:
        assert client.files is not None  # opened on first use: made there
    finally:
        client.close()
    assert os.path.isdir(files / "default" / "ft")
    assert plane.delete("CacheRuntime", "ft") == "cacheruntime.datacache.io/ft deleted"
    assert os.listdir(files) == []  # neither ft nor its now empty namespace directory is left
