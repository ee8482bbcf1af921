"""Read-ahead across files (``datacache.file_readahead``): a scan of a directory in name order
gets the next ``AHEAD_FILES`` files filled from the UFS before it reads them (the reads are then
cache hits, and the bytes right); a shuffled order, or a jump, prefetches nothing; reaching the
end of a directory goes no further."""

from __future__ import annotations

import hashlib
import os
import random
import time

from datacache.control.embedded import read_path
from datacache.file_readahead import AHEAD_FILES, FileReadAhead
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
    apply_dataset(home, "pics", [{"name": "src", "mountPoint": f"local://{tmp_path / 'src'}"}]).close()
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
        assert _read(client, train[0]) == files[train[0]]
        assert _cached(client, train[1:]) == []  # one read is not a scan yet
        assert _read(client, train[1]) == files[train[1]]
        window = train[2:2 + AHEAD_FILES]
        assert _wait_cached(client, window) == window
        assert _cached(client, train[2 + AHEAD_FILES:]) == []  # no further than the window
        hits0, misses0 = client.source.hit_counts()
        for p in window:
            assert hashlib.sha256(_read(client, p)).digest() == hashlib.sha256(files[p]).digest()
        hits, misses = client.source.hit_counts()
        assert (hits - hits0, misses - misses0) == (len(window), 0)
        for p in train[2 + AHEAD_FILES:]:  # the rest of the scan: each read moves the window on
            assert _read(client, p) == files[p]
        assert ahead.prefetched == N - 2  # every file after the first two, once; none past the end
        assert _cached(client, [p for p in files if p.startswith("val/")]) == []  # another directory
    finally:
        client.close()
        paths.close()


def test_a_shuffled_order_prefetches_nothing(tmp_path, datacache_home):
    files = _dataset(tmp_path, datacache_home)
    val = sorted(p for p in files if p.startswith("val/"))
    order = val[::7] + val[3::7]  # jumps of 7 places, then back: never the next few files
    random.Random(3).shuffle(order)
    order = [p for i, p in enumerate(order) if i == 0 or not 0 < val.index(p) - val.index(order[i - 1]) <= 4]
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
