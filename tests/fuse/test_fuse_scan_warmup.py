"""Scan warmup through a real mount: 4 reader processes read a shuffled third of a cold tree of
60 files from moto S3; the daemon warms the rest of the tree in the background (its log says so),
every file of the tree is then 100 % cached (``user.datacache.cached``) with its bytes right, and a
sibling tree stays cold."""

from __future__ import annotations

import os
import random
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from datacache.scan_warmup import TRIGGER_FILES
from datacache_fuse.daemon import read_state
from fuse_support import S3_KEY, S3_SECRET, apply_dataset, force_cleanup, mount, sha256, sha256_path, wait_until


def _read(path: str) -> str:
    return sha256_path(path)


def test_a_shuffled_cold_epoch_through_the_mount_warms_its_tree(fuse_env, fuse_moto, mountpoint):
    rng = np.random.default_rng(5)
    objects = {f"train/c{c}/{k:02d}.jpg": rng.bytes(int(rng.integers(20_000, 120_000)))
               for c in range(3) for k in range(20)}
    objects.update({f"val/{k:02d}.jpg": rng.bytes(30_000) for k in range(10)})
    fs = fuse_moto.s3fs(key=S3_KEY, secret=S3_SECRET)
    fs.mkdir("fusescan")
    fs.pipe({f"fusescan/data/{k}": v for k, v in objects.items()})
    apply_dataset(fuse_env.home, "scan", fuse_moto.endpoint_url, "fusescan", None)
    train = sorted(p for p in objects if p.startswith("train/"))
    first = random.Random(2).sample(train, 2 * TRIGGER_FILES)
    pid = None
    try:
        pid = mount(fuse_env, mountpoint, name="scan")
        with ProcessPoolExecutor(4) as readers:  # DataLoader-shaped: 4 processes, shuffled order
            sums = list(readers.map(_read, [os.path.join(mountpoint, p) for p in first]))
        assert sums == [sha256(objects[p]) for p in first]
        cached = lambda p: os.getxattr(os.path.join(mountpoint, p), "user.datacache.cached")  # noqa: E731
        wait_until(lambda: all(cached(p) == b"1.0" for p in train), 60, "every file of train/ cached")
        with open(read_state(fuse_env.home, mountpoint)["log"], encoding="utf-8") as f:
            assert "scan of dataset 'scan' under 'train': warming its 60 files" in f.read()
        assert [cached(p) for p in objects if p.startswith("val/")] == [b"0.0"] * 10
        for p in train:
            assert sha256_path(os.path.join(mountpoint, p)) == sha256(objects[p]), p
    finally:
        force_cleanup(fuse_env.home, mountpoint, pid)
