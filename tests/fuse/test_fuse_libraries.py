"""Training-code access patterns through the mount, unchanged: Pillow, numpy.memmap / mmap,
pyarrow, and a PyTorch DataLoader with several worker processes."""

from __future__ import annotations

import hashlib
import io
import mmap
import os
import random

import numpy as np
import pytest

from fuse_support import BIG_SIZE, sha256


def test_pillow_decodes_images(mnt, fuse_env):
    from PIL import Image

    images = sorted(p for p in fuse_env.expected if p.startswith("s3/imgs/"))
    assert len(images) == 12
    for rel in images:
        with Image.open(os.path.join(mnt, rel)) as img:
            got = np.asarray(img.convert("RGB"))
        with Image.open(io.BytesIO(fuse_env.source(rel))) as img:
            want = np.asarray(img.convert("RGB"))
        assert got.shape == want.shape and np.array_equal(got, want), rel


def test_numpy_memmap_equals_source(mnt, fuse_env):
    rel = "local/big.bin"
    src = np.frombuffer(fuse_env.source(rel), dtype=np.uint8)
    arr = np.memmap(os.path.join(mnt, rel), dtype=np.uint8, mode="r")
    try:
        assert arr.shape == (BIG_SIZE,)
        assert np.array_equal(arr[-4096:], src[-4096:])  # tail first: random access
        assert np.array_equal(arr, src)
        as_u32 = np.memmap(os.path.join(mnt, rel), dtype=np.uint32, mode="r", shape=(1000,), offset=4 << 20)
        assert np.array_equal(as_u32, src[4 << 20:(4 << 20) + 4000].view(np.uint32))
        del as_u32
    finally:
        del arr


def test_mmap_random_slices(mnt, fuse_env):
    rel = "s3/medium.bin"
    src = fuse_env.source(rel)
    rng = random.Random(11)
    with open(os.path.join(mnt, rel), "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        assert len(m) == len(src)
        for _ in range(100):
            off = rng.randrange(len(src))
            n = rng.randrange(1, 200_000)
            assert m[off:off + n] == src[off:off + n]


def test_pyarrow_reads_parquet(mnt, fuse_env):
    import pyarrow.parquet as pq

    want = pq.read_table(io.BytesIO(fuse_env.source("s3/table.parquet")))
    path = os.path.join(mnt, "s3/table.parquet")
    assert pq.read_table(path).equals(want)
    assert pq.read_table(path, memory_map=True).equals(want)
    pf = pq.ParquetFile(path)
    assert pf.metadata.num_row_groups == 5
    assert pf.read_row_group(3).equals(want.slice(3000, 1000))


class _FileDataset:
    """A map-style dataset as a PyTorch user writes it: ``__getitem__`` opens a path."""

    def __init__(self, root: str, paths: list[str]):
        self.root, self.paths = root, paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        rel = self.paths[i]
        if isinstance(rel, tuple):  # (path, offset, size): a slice of a large file
            rel, off, n = rel
            with open(os.path.join(self.root, rel), "rb") as f:
                f.seek(off)
                return i, hashlib.sha256(f.read(n)).hexdigest()
        with open(os.path.join(self.root, rel), "rb") as f:
            return i, hashlib.sha256(f.read()).hexdigest()


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 4 workers on 2 cores, on purpose
def test_pytorch_dataloader_with_worker_processes(mnt, fuse_env):
    """A real torch DataLoader: 4 worker processes, shuffled, two epochs of every file plus
    concurrent slices of one big file, every sample checked by sha256."""
    from torch.utils.data import DataLoader

    files = fuse_env.shared_files
    rng = random.Random(5)
    big = fuse_env.source("local/big.bin")
    slices = [("local/big.bin", rng.randrange(BIG_SIZE), rng.randrange(1, 3 << 20)) for _ in range(24)]
    items = files * 2 + slices
    loader = DataLoader(_FileDataset(mnt, items), batch_size=4, shuffle=True, num_workers=4,
                        collate_fn=lambda batch: batch)
    results = dict(sample for batch in loader for sample in batch)
    assert len(results) == len(items)
    for i, item in enumerate(items):
        if isinstance(item, tuple):
            _, off, n = item
            assert results[i] == sha256(big[off:off + n]), item
        else:
            assert results[i] == fuse_env.expected[item], item
