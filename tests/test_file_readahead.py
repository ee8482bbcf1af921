"""Read-ahead across files (``datacache.file_readahead``): a scan of a directory in name order
gets the next ``AHEAD_FILES`` files filled from the UFS before it reads them (the reads are then
cache hits, and the bytes right); a shuffled order, whose steps land on the next file now and then
but not ``CONFIRM`` times in a row, or a jump, prefetches nothing; reaching the end of a directory
goes no further."""

from __future__ import annotations

import hashlib
import os
import random
import time

from datacache.control.embedded import read_path
from datacache.file_readahead import AHEAD_FILES, CONFIRM, FileReadAhead
from support import apply_dataset

N = 30


def _dataset(tmp_path, home) -> dict[str, bytes]:
    files = {}
    for d in ("train", "val"):
        (tmp_path / "src" / d).mkdir(parents=True)
        for i in range(N):
            data = os.urandom(5000 + i)
            (tmp_path / "src" / d / f"{i:03d}.jpg").write_bytes(data)
            files[f"{d}/{i:03d}.jpg"] = data
    # scan warmup off: a shuffled read of most of a directory would load the rest (test_scan_warmup.py)
    apply_dataset(home, "pics", [{"name": "src", "mountPoint": f"local://{tmp_path / 'src'}"}],
                  fuse={"scanWarmup": False}).close()
    return files


def _cached(client, paths: list[str]) -> list[str]:
    return [p for p in paths if client.cached_fraction(client.stat(p)) == 1.0]


def _read(client, path: str) -> bytes:
    entry = client.stat(path)
    return client.read(entry, 0, entry.size)


def _wait_cached(client, paths: list[str], timeout: float = 10.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(_cached(client, paths)) < len(paths):
        time.sleep(0.02)
    return _cached(client, paths)


def test_a_scan_in_name_order_finds_the_next_files_cached(tmp_path, datacache_home):
    files = _dataset(tmp_path, datacache_home)
    train = sorted(p for p in files if p.startswith("train/"))
    paths = read_path(str(datacache_home))
    client = paths.open_dataset("pics")
    try:
        ahead = next(r for r in client._readers if isinstance(r, FileReadAhead))
        first = CONFIRM + 1  # files read before the scan is taken for one
        for p in train[:first - 1]:
            assert _read(client, p) == files[p]
        assert _cached(client, train[first - 1:]) == []  # CONFIRM - 1 steps are not a scan yet
        assert _read(client, train[first - 1]) == files[train[first - 1]]
        window = train[first:first + AHEAD_FILES]
        assert _wait_cached(client, window) == window
        assert _cached(client, train[first + AHEAD_FILES:]) == []  # no further than the window
        hits0, misses0 = client.source.hit_counts()
        for p in window:
            assert hashlib.sha256(_read(client, p)).digest() == hashlib.sha256(files[p]).digest()
        hits, misses = client.source.hit_counts()
        assert (hits - hits0, misses - misses0) == (len(window), 0)
        for p in train[first + AHEAD_FILES:]:  # the rest of the scan: each read moves the window on
            assert _read(client, p) == files[p]
        assert ahead.prefetched == N - first  # every file after the first ones, once; none past the end
        assert _cached(client, [p for p in files if p.startswith("val/")]) == []  # another directory
    finally:
        client.close()
        paths.close()


def test_a_shuffled_order_prefetches_nothing(tmp_path, datacache_home):
    files = _dataset(tmp_path, datacache_home)
    val = sorted(p for p in files if p.startswith("val/"))
    # Runs of CONFIRM neighbours in a shuffled order (CONFIRM - 1 steps onto the next file, as a
    # shuffle of a small directory has now and then), each run a jump away from the last.
    order: list[int] = []
    for start in random.Random(3).sample(range(0, N - CONFIRM + 1, CONFIRM), (N - CONFIRM + 1) // CONFIRM):
        if not order or not 0 < start - order[-1] <= 4:
            order += range(start, start + CONFIRM)
    small = [0 < b - a <= 4 for a, b in zip(order, order[1:])]
    assert small.count(True) >= 5 and "1" * CONFIRM not in "".join(str(int(x)) for x in small)
    order = [val[i] for i in order]
    paths = read_path(str(datacache_home))
    client = paths.open_dataset("pics")
    try:
        ahead = next(r for r in client._readers if isinstance(r, FileReadAhead))
        for p in order:
            assert _read(client, p) == files[p]
        time.sleep(0.3)
        assert ahead.prefetched == 0
        assert sorted(_cached(client, val)) == sorted(order)  # what was read, nothing else
    finally:
        client.close()
        paths.close()
