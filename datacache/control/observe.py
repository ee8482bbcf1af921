"""Cached bytes of a dataset, from one scan of the block stores' indexes (cases C13, C14).

Asking the store about every block of every file costs one index lookup per block (41 s for a
dataset of 1,000,000 files). Instead the stores' keys are listed once into a set (each checked
by a ``stat`` of its block file: the index alone said 100 % with block files deleted, issue 18), and the manifest
is walked once computing each file's current block keys (``dataset/file_id/index``, see
:mod:`datacache.cache.blocks`): blocks of old versions are held but never counted.
Needs no UFS access, so status never needs the UFS credentials.
"""

from __future__ import annotations

from typing import Iterable, Iterator

from datacache.cache.blocks import block_count, file_id
from datacache.manifest import Manifest

_BATCH_ROWS = 65536  # manifest rows turned into Python values at a time


def current_blocks(manifest: Manifest, dataset: str, block_size: int) -> Iterator[tuple[list[str], list[int]]]:
    """``(keys, lengths)`` of ``manifest``'s current-version blocks (``str(BlockKey)``, bytes; a
    file's last block its real, shorter length), one list pair per batch of manifest rows, read
    column-wise (no per-row objects)."""
    for batch in manifest.table.select(["mount", "ufs_path", "version", "size"]).to_batches(_BATCH_ROWS):
        keys: list[str] = []
        lengths: list[int] = []
        mounts, paths, versions, sizes = (col.to_pylist() for col in batch.columns)
        for mount, path, version, size in zip(mounts, paths, versions, sizes):
            prefix = f"{dataset}/{file_id(mount, path, version, block_size)}/"
            for i in range(block_count(size, block_size)):
                keys.append(prefix + str(i))
                lengths.append(min(block_size, size - i * block_size))
        yield keys, lengths


def cached_bytes(manifest: Manifest, stored: set[str], dataset: str, block_size: int) -> int:
    """Bytes of ``manifest``'s current-version blocks whose keys (``str(BlockKey)``) are in
    ``stored``; the last block of a file counts its real, shorter length. About 1 s per million
    files."""
    if not stored:
        return 0
    return sum(length for keys, lengths in current_blocks(manifest, dataset, block_size)
               for key, length in zip(keys, lengths) if key in stored)


def trace_cached(manifest: Manifest, stored: set[str], dataset: str, block_size: int,
                 paths: list[str] | None) -> tuple[int, int] | None:
    """``(cached, total)`` bytes of the current versions of ``paths`` (a recorded run's files;
    those no longer in ``manifest`` are left out), as :func:`cached_bytes` counts them; None for
    None (no run recorded)."""
    if paths is None:
        return None
    entries = [e for e in map(manifest.lookup, paths) if e is not None]
    if not entries:
        return 0, 0
    return cached_bytes(Manifest.from_entries(entries), stored, dataset, block_size), sum(e.size for e in entries)


def stored_bytes(store, prefix: str) -> int:
    """Bytes of the blocks whose keys start with ``prefix`` on every level of a TieredStore that
    can sum them (disk levels, as :func:`store_keys`): every version's, not only the current.
    Sums the index: run :func:`store_keys` first, which drops the rows of lost block files."""
    return sum(level.prefix_bytes(prefix) for level in store.levels if hasattr(level, "prefix_bytes"))


def store_keys(store) -> Iterable[str]:
    """Keys of the blocks really held by every level of a TieredStore that can list them (disk
    levels: a block counts when its file is there at its indexed size, one ``stat`` each, so
    files deleted or truncated behind the cache's back are not counted and their index rows are
    dropped); a MEM level of another process is not visible, and is empty in this one."""
    for level in store.levels:
        present = getattr(level, "present_keys", None)
        if present is not None:
            yield from present()
