"""The ways training code loads files, each timed by :mod:`benchmarks.fuse_read` on every side.

Each function reads whole files the way one kind of training code does and returns
``(bytes, files)``:

- :func:`memmap_copy`: ``numpy.memmap`` of a file, copied into memory (page faults drive the
  reads, as a memmap'd token or feature array does);
- :func:`safetensors_load`: ``safetensors.numpy.load_file`` (Hugging Face's weights loader, which
  mmaps the file and copies every tensor out);
- :func:`fio_randread`: ``fio --rw=randread --bs=128k`` over a file (psync engine, no
  ``invalidate``: the caller drops the page cache for both sides alike; fio's own invalidation is
  a ``POSIX_FADV_DONTNEED`` on the file it opened, which on a passthrough mount would drop the
  FUSE inode's pages and leave the backing file's cached);
- :class:`ProcessReaders`: ``N`` reader processes, each opening its share of the files with
  buffered ``open()`` and ``read()`` (a PyTorch DataLoader's workers).
"""

from __future__ import annotations

import json
import multiprocessing
import subprocess

import numpy as np

MiB = 1 << 20


def memmap_copy(path: str) -> tuple[int, int]:
    """Copy the whole file out of a read-only ``numpy.memmap``; ``(bytes, 1)``."""
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    try:
        out = np.array(mm, copy=True)
    finally:
        del mm
    return out.nbytes, 1


def write_safetensors(path: str, nbytes: int, seed: int = 7) -> None:
    """A safetensors file of about ``nbytes`` bytes: float32 tensors of 16 MiB (the last shorter)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    tensors, left, i = {}, nbytes, 0
    while left > 0:
        n = min(16 * MiB, left) // 4
        tensors[f"layer{i:03d}.weight"] = rng.standard_normal(n, dtype=np.float32)
        left -= 4 * n
        i += 1
    save_file(tensors, path)


def safetensors_load(path: str) -> tuple[int, int]:
    """``safetensors.numpy.load_file(path)``; ``(bytes of all tensors, 1)``."""
    from safetensors.numpy import load_file

    return sum(t.nbytes for t in load_file(path).values()), 1


def fio_randread(path: str, io_bytes: int, bs: str = "128k") -> tuple[int, int]:
    """``fio`` random reads of ``bs`` over ``path`` until ``io_bytes`` are read (psync, one job,
    ``--invalidate=0``, ``--readonly``); ``(bytes fio read, 1)``. Raises
    :class:`subprocess.CalledProcessError` when fio fails, :class:`FileNotFoundError` without fio
    (Debian: fio)."""
    out = subprocess.run(["fio", "--name=randread", f"--filename={path}", "--rw=randread", f"--bs={bs}",
                          "--ioengine=psync", "--invalidate=0", "--readonly", f"--io_size={io_bytes}",
                          "--output-format=json"], capture_output=True, text=True, check=True)
    job = json.loads(out.stdout)["jobs"][0]["read"]
    return int(job["io_bytes"]), 1


def _read_share(paths: list[str], buffered: bool) -> tuple[int, int]:
    total = 0
    for p in paths:
        with open(p, "rb", buffering=-1 if buffered else 0) as f:
            total += len(f.read())
    return total, len(paths)


class ProcessReaders:
    """``processes`` forked reader processes; :meth:`read` splits ``paths`` into one contiguous
    share each and returns ``(bytes, files)`` summed. Use as a context manager (the pool is closed
    at exit).

    A buffered ``open()`` (``buffered=True``, the default: what PIL, torchvision and most loaders
    do) asks ``isatty()``, an ``ioctl(TCGETS)`` that on Python before 3.14 reaches any FUSE
    daemon as one IOCTL round trip per file (fs/fuse/ioctl.c forwards every ioctl; CPython 3.14
    skips the call for regular files, gh-90102); ``buffered=False`` opens with ``buffering=0``."""

    def __init__(self, processes: int = 4):
        self.processes = processes
        self._pool = multiprocessing.get_context("fork").Pool(processes)

    def read(self, paths: list[str], buffered: bool = True) -> tuple[int, int]:
        n = -(-len(paths) // self.processes)
        shares = [(paths[i:i + n], buffered) for i in range(0, len(paths), n)]
        parts = self._pool.starmap(_read_share, shares)
        return sum(b for b, _ in parts), sum(f for _, f in parts)

    def __enter__(self) -> "ProcessReaders":
        return self

    def __exit__(self, *exc) -> None:
        self._pool.close()
        self._pool.join()
