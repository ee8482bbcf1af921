"""Helpers shared by the core tests: declare a dataset as YAML and apply it embedded."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess

import pytest

from datacache.api.loader import load_resources
from datacache.cache.disk import DiskTier
from datacache.control.supervisor import wait_until
from datacache.control.embedded import Embedded, read_path


def dataset_yaml(name: str, mounts: list[dict], levels: list[dict], block_size: str = "4Mi",
                 fuse: dict | None = None) -> str:
    """Dataset + CacheRuntime documents (JSON is valid YAML); ``fuse``: the runtime's ``spec.fuse``."""
    ds = {"apiVersion": "datacache.io/v1alpha1", "kind": "Dataset", "metadata": {"name": name},
          "spec": {"mounts": mounts}}
    rt = {"apiVersion": "datacache.io/v1alpha1", "kind": "CacheRuntime", "metadata": {"name": name},
          "spec": {"blockSize": block_size, "tieredstore": {"levels": levels}, **({"fuse": fuse} if fuse else {})}}
    return json.dumps(ds) + "\n---\n" + json.dumps(rt) + "\n"


def apply_dataset(home, name: str, mounts: list[dict], levels: list[dict] | None = None,
                  block_size: str = "4Mi", fuse: dict | None = None) -> Embedded:
    """Write ``NAME.yaml`` beside ``home``, apply it and return the control plane."""
    levels = levels or [{"mediumtype": "SSD", "path": "cache", "quota": "1Gi"}]
    path = os.path.join(os.path.dirname(os.path.abspath(home)), f"{name}.yaml")
    with open(path, "w") as f:
        f.write(dataset_yaml(name, mounts, levels, block_size, fuse))
    plane = Embedded(str(home))
    plane.apply(load_resources(path))
    return plane


@contextlib.contextmanager
def opened_dataset(home, name: str):
    """Yield a DatasetClient of dataset ``name`` through the embedded read path of ``home``;
    closed (client, then read path) after."""
    paths = read_path(str(home))
    client = paths.open_dataset(name)
    try:
        yield client
    finally:
        client.close()
        paths.close()


def s3_mount(moto_server, bucket: str, prefix: str = "", name: str = "s3", path: str | None = None) -> dict:
    """A mount of ``s3://bucket/prefix`` on the moto server (dummy credentials in plain options
    would be refused: they go through the environment secret refs set by ``s3_secrets``)."""
    mount = {"name": name, "mountPoint": f"s3://{bucket}/{prefix}".rstrip("/"),
             "options": {"endpoint_url": moto_server.endpoint_url},
             "encryptOptions": [
                 {"name": "key", "valueFrom": {"secretKeyRef": {"name": "moto", "key": "key"}}},
                 {"name": "secret", "valueFrom": {"secretKeyRef": {"name": "moto", "key": "secret"}}}]}
    if path:
        mount["path"] = path
    return mount


def du(path: str) -> int:
    """Bytes of regular files under ``path`` (what the cache directory really holds): a sparse
    cache file counts its allocated blocks, not its holes."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                st = os.lstat(os.path.join(root, f))
                total += min(st.st_size, st.st_blocks * 512)
            except FileNotFoundError:
                pass
    return total


def disk_keys(path) -> set[str]:
    """Block keys stored in the cache directory ``path`` (opened as another process would)."""
    tier = DiskTier(str(path), 1 << 40)
    try:
        return set(tier.keys())
    finally:
        tier.close()


def wait_for(predicate, timeout: float = 30.0, what: str = "condition", interval: float = 0.05):
    """Poll ``predicate`` every ``interval`` seconds until it returns something true (returned);
    AssertionError naming ``what`` after ``timeout`` seconds."""
    value = wait_until(predicate, timeout, interval)
    assert value, f"timed out after {timeout:g} s waiting for {what}"
    return value


def loop_mounted(tmp_path, mkfs: list[str], size: int, name: str):
    """Yield a fresh file system made by ``mkfs + [image]`` on a ``size``-byte image, mounted on a
    loop device at ``tmp_path/name``; unmounted after. Skips (with the reason) without root, the
    ``mkfs`` tool or a loop device."""
    if os.geteuid() != 0 or shutil.which(mkfs[0]) is None:
        pytest.skip(f"needs root and {mkfs[0]} (make system installs it)")
    image, where = tmp_path / f"{name}.img", tmp_path / name
    with open(image, "wb") as f:
        f.truncate(size)
    subprocess.run([*mkfs, str(image)], check=True, capture_output=True)
    where.mkdir()
    mounted = subprocess.run(["mount", "-o", "loop", str(image), str(where)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"no loop device here: {mounted.stderr.strip()}")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=True)
