"""Read-ahead across files (``datacache.file_readahead``): a scan of a directory in name order
gets the next ``AHEAD_FILES`` files filled from the UFS before it reads them (the reads are then
cache hits, and the bytes right); a shuffled order, whose steps land on the next file now and then
but not ``CONFIRM`` times in a row, or a jump, prefetches nothing; reaching the end of a directory
goes no further; the next epoch's scan is followed again; 80 directories scanned side by side are
all followed, none of them listed; a subdirectory's files are not prepared for its parent's scan."""

from __future__ import annotations

import hashlib
import os
import random
import time

from datacache.file_readahead import AHEAD_FILES, CONFIRM, FileReadAhead
from support import apply_dataset, opened_dataset

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
    with opened_dataset(datacache_home, "pics") as client:
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


def test_the_next_scan_of_a_directory_is_followed_again(tmp_path, datacache_home):
    files = _dataset(tmp_path, datacache_home)
    train = sorted(p for p in files if p.startswith("train/"))
    with opened_dataset(datacache_home, "pics") as client:
        ahead = next(r for r in client._readers if isinstance(r, FileReadAhead))
        for epoch in (1, 2):  # the second epoch starts at the first file, far behind the window
            for p in train:
                assert _read(client, p) == files[p]
            assert ahead.prefetched == epoch * (N - CONFIRM - 1)


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
    with opened_dataset(datacache_home, "pics") as client:
        ahead = next(r for r in client._readers if isinstance(r, FileReadAhead))
        for p in order:
            assert _read(client, p) == files[p]
        time.sleep(0.3)
        assert ahead.prefetched == 0
        assert sorted(_cached(client, val)) == sorted(order)  # what was read, nothing else


def test_scans_of_many_directories_at_once_are_followed_without_listing_them(tmp_path, datacache_home):
    # 80 directories scanned side by side (one read in each in turn, as 80 readers of one
    # directory each would): more directories than a per-directory listing cache held (64).
    dirs, per_dir = 80, CONFIRM + 3
    files = {}
    for d in range(dirs):
        (tmp_path / "src" / f"d{d:02d}").mkdir(parents=True)
        for i in range(per_dir):
            data = os.urandom(3000 + d)
            (tmp_path / "src" / f"d{d:02d}" / f"{i}.bin").write_bytes(data)
            files[f"d{d:02d}/{i}.bin"] = data
    apply_dataset(datacache_home, "many", [{"name": "src", "mountPoint": f"local://{tmp_path / 'src'}"}],
                  fuse={"scanWarmup": False}).close()
    with opened_dataset(datacache_home, "many") as client:
        ahead = next(r for r in client._readers if isinstance(r, FileReadAhead))
        for i in range(CONFIRM + 1):  # the CONFIRM-th step in each directory prepares its last 2 files
            for d in range(dirs):
                p = f"d{d:02d}/{i}.bin"
                assert _read(client, p) == files[p]
        rest = [f"d{d:02d}/{i}.bin" for d in range(dirs) for i in range(CONFIRM + 1, per_dir)]
        assert ahead.prefetched == len(rest) == dirs * 2
        assert _wait_cached(client, rest) == rest
        hits0, misses0 = client.source.hit_counts()
        for p in rest:
            assert hashlib.sha256(_read(client, p)).digest() == hashlib.sha256(files[p]).digest()
        assert client.source.hit_counts() == (hits0 + len(rest), misses0)
        assert client.namespace.manifest._dir_cache == {}  # no directory was listed to follow the scans


def test_a_scan_steps_over_a_subdirectory_and_prepares_only_its_own_files(tmp_path, datacache_home):
    # name order of 'top': a0 a1 a2 a3 b/ c0 c1 ...; the rows of b/'s files lie between a3 and c0
    src = tmp_path / "src"
    (src / "top" / "b").mkdir(parents=True)
    files = {}
    for name in ["a0", "a1", "a2", "a3", "c0", "c1", "c2"] + [f"b/{i}" for i in range(3)]:
        data = os.urandom(2000 + len(files))
        (src / "top" / name).write_bytes(data)
        files[f"top/{name}"] = data
    apply_dataset(datacache_home, "sub", [{"name": "src", "mountPoint": f"local://{src}"}],
                  fuse={"scanWarmup": False}).close()
    with opened_dataset(datacache_home, "sub") as client:
        ahead = next(r for r in client._readers if isinstance(r, FileReadAhead))
        for p in ("top/a0", "top/a1", "top/a2", "top/a3"):  # the third step prepares the next 8 rows' own files
            assert _read(client, p) == files[p]
        own = ["top/c0", "top/c1", "top/c2"]
        assert _wait_cached(client, own) == own
        assert _cached(client, [f"top/b/{i}" for i in range(3)]) == []  # the subdirectory's files are not its
        assert ahead.prefetched == 3
