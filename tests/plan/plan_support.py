"""A small dataset of random files for the plan tests."""

from __future__ import annotations

import os

from support import apply_dataset


def make_dataset(home, tmp_path, name: str, sizes: list[int]):
    """``(plane, {path: bytes})``: dataset ``name`` of files ``train/NNN.jpg`` of ``sizes`` bytes
    (random) on a local mount, 64 KiB blocks, synced. Close the plane."""
    src = tmp_path / f"src-{name}"
    (src / "train").mkdir(parents=True)
    files = {}
    for i, size in enumerate(sizes):
        files[f"train/{i:03d}.jpg"] = os.urandom(size)
        (src / "train" / f"{i:03d}.jpg").write_bytes(files[f"train/{i:03d}.jpg"])
    plane = apply_dataset(home, name, [{"name": "local", "mountPoint": str(src)}], block_size="64Ki")
    plane.sync(name)
    return plane, files
