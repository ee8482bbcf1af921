"""Scan warmup (``datacache.scan_warmup``): once ``TRIGGER_FILES`` distinct files of a tree were
read cold in a shuffled order, the rest of the tree is loaded in the background (the reads still to
come are cache hits with the right bytes, the UFS sends each byte about once, a sibling tree stays
cold); a warm epoch, a tree larger than half the cache, another process holding the dataset's scan
lock and ``fuse.scanWarmup: false`` start none."""

from __future__ import annotations

import fcntl
import hashlib
import os
import random

import pytest

from datacache.control.embedded import read_path
from datacache.scan_warmup import TRIGGER_FILES, ScanWarmup
from support import apply_dataset, s3_mount

CLASSES, PER_CLASS, SIZE = 3, 24, 20_000


def _tree(tmp_path) -> dict[str, bytes]:
    """``train/<class>/<k>.jpg`` (CLASSES x PER_CLASS files) and ``val/<k>.jpg`` (PER_CLASS)."""
    files = {}
    for d in [f"train/c{c}" for c in range(CLASSES)] + ["val"]:
        (tmp_path / "src" / d).mkdir(parents=True)
        for k in range(PER_CLASS):
            data = os.urandom(SIZE + k)
            (tmp_path / "src" / d / f"{k:03d}.jpg").write_bytes(data)
            files[f"{d}/{k:03d}.jpg"] = data
    return files


def _listener(client) -> ScanWarmup:
    return next(r for r in client._readers if isinstance(r, ScanWarmup))


def _read(client, path: str) -> bytes:
    entry = client.stat(path)
    return client.read(entry, 0, entry.size)


def _cached(client, paths) -> list[str]:
    return sorted(p for p in paths if client.cached_fraction(client.stat(p)) == 1.0)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_shuffled_cold_epoch_gets_the_rest_of_its_tree_loaded_from_s3(tmp_path, datacache_home, moto_server,
                                                                         s3_bucket, moto_secrets):
    fs, bucket = s3_bucket
    files = _tree(tmp_path)
    fs.put(str(tmp_path / "src") + "/", f"{bucket}/", recursive=True)
    apply_dataset(datacache_home, "pics", [s3_mount(moto_server, bucket)]).close()
    train = sorted(p for p in files if p.startswith("train/"))
    order = random.Random(7).sample(train, len(train))
    paths = read_path(str(datacache_home))
    client = paths.open_dataset("pics")
    try:
        scan = _listener(client)
        for p in order[:TRIGGER_FILES - 1]:
            assert _sha(_read(client, p)) == _sha(files[p])
        assert scan.started == [] and _cached(client, train) == sorted(order[:TRIGGER_FILES - 1])
        assert _sha(_read(client, order[TRIGGER_FILES - 1])) == _sha(files[order[TRIGGER_FILES - 1]])
        scan.wait(30)
        assert scan.started == ["train"]
        assert oct(os.stat(scan.lock_path).st_mode & 0o777) == "0o600"
        assert _cached(client, train) == train
        assert _cached(client, [p for p in files if p.startswith("val/")]) == []  # a sibling tree
        hits0, misses0 = client.source.hit_counts()
        for p in order[TRIGGER_FILES:]:
            assert _sha(_read(client, p)) == _sha(files[p])
        hits, misses = client.source.hit_counts()
        assert (hits - hits0, misses - misses0) == (len(train) - TRIGGER_FILES, 0)
        # each byte about once: at most the file being read when the warmup started twice
        train_bytes = sum(len(files[p]) for p in train)
        assert train_bytes <= client.source.ufs_bytes <= train_bytes + SIZE + PER_CLASS
    finally:
        client.close()
        paths.close()


def _local(tmp_path, datacache_home, **kwargs) -> dict[str, bytes]:
    files = _tree(tmp_path)
    apply_dataset(datacache_home, "pics", [{"name": "src", "mountPoint": f"local://{tmp_path / 'src'}"}],
                  **kwargs).close()
    return files


def _epoch(client, files, paths) -> None:
    for p in random.Random(11).sample(paths, len(paths)):
        assert _sha(_read(client, p)) == _sha(files[p])


def test_a_warm_epoch_starts_no_warmup(tmp_path, datacache_home):
    files = _local(tmp_path, datacache_home)
    train = sorted(p for p in files if p.startswith("train/"))
    paths = read_path(str(datacache_home))
    first = paths.open_dataset("pics")
    try:
        _epoch(first, files, train)
        _listener(first).wait(30)
    finally:
        first.close()
    second = paths.open_dataset("pics")  # a new reading process: the epoch is warm
    try:
        _epoch(second, files, train)
        scan = _listener(second)
        scan.wait(30)
        assert scan.started == [] and scan._done == {"train"}
    finally:
        second.close()
        paths.close()


def test_a_tree_larger_than_half_the_cache_is_not_loaded(tmp_path, datacache_home):
    files = _local(tmp_path, datacache_home, levels=[{"mediumtype": "SSD", "path": "cache", "quota": "1Mi"}])
    train = sorted(p for p in files if p.startswith("train/"))
    assert sum(map(len, files.values())) > (1 << 20) // 2 + (1 << 18)
    paths = read_path(str(datacache_home))
    client = paths.open_dataset("pics")
    try:
        order = random.Random(5).sample(train, TRIGGER_FILES)
        for p in order:
            assert _sha(_read(client, p)) == _sha(files[p])
        scan = _listener(client)
        scan.wait(30)
        assert scan.started == [] and scan._too_large == {"train"} and scan._done == set()
        assert set(_cached(client, train)) <= set(order)
    finally:
        client.close()
        paths.close()


def test_another_process_warming_the_dataset_holds_it_off_until_it_is_done(tmp_path, datacache_home):
    files = _local(tmp_path, datacache_home)
    train = sorted(p for p in files if p.startswith("train/"))
    order = random.Random(9).sample(train, len(train))
    paths = read_path(str(datacache_home))
    client = paths.open_dataset("pics")
    scan = _listener(client)
    held = os.open(scan.lock_path, os.O_RDWR | os.O_CREAT, 0o600)  # as the scan warmup of another process holds it
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        for p in order[:TRIGGER_FILES]:
            assert _sha(_read(client, p)) == _sha(files[p])
        scan.wait(30)
        assert scan.started == [] and _cached(client, train) == sorted(order[:TRIGGER_FILES])
        fcntl.flock(held, fcntl.LOCK_UN)
        for p in order[TRIGGER_FILES:2 * TRIGGER_FILES]:  # the next trigger looks again
            assert _sha(_read(client, p)) == _sha(files[p])
        scan.wait(30)
        assert scan.started == ["train"] and _cached(client, train) == train
    finally:
        os.close(held)
        client.close()
        paths.close()


@pytest.mark.parametrize("setting", [False, True])
def test_fuse_scan_warmup_false_turns_it_off(tmp_path, datacache_home, setting):
    files = _local(tmp_path, datacache_home, fuse={"scanWarmup": setting})
    train = sorted(p for p in files if p.startswith("train/"))
    paths = read_path(str(datacache_home))
    client = paths.open_dataset("pics")
    try:
        assert any(isinstance(r, ScanWarmup) for r in client._readers) is setting
        order = random.Random(3).sample(train, TRIGGER_FILES)
        for p in order:
            assert _sha(_read(client, p)) == _sha(files[p])
        for r in client._readers:
            if isinstance(r, ScanWarmup):
                r.wait(30)
        assert _cached(client, train) == (train if setting else sorted(order))
    finally:
        client.close()
        paths.close()


def test_a_stray_read_outside_the_tree_does_not_turn_it_off(tmp_path, datacache_home):
    """The first window holds a root file and 15 of train/: its tree, the root, is larger than half
    the cache; train/ alone is not, and the next window's reads (all in train/) warm it."""
    files = _tree(tmp_path)
    (tmp_path / "src" / "labels.csv").write_bytes(b"k,label\n" * 100)
    files["labels.csv"] = b"k,label\n" * 100
    apply_dataset(datacache_home, "pics", [{"name": "src", "mountPoint": f"local://{tmp_path / 'src'}"}],
                  levels=[{"mediumtype": "SSD", "path": "cache", "quota": "3Mi"}]).close()
    train = sorted(p for p in files if p.startswith("train/"))
    total = sum(map(len, files.values()))
    assert sum(len(files[p]) for p in train) < (3 << 20) // 2 < total
    paths = read_path(str(datacache_home))
    client = paths.open_dataset("pics")
    try:
        scan = _listener(client)
        assert _sha(_read(client, "labels.csv")) == _sha(files["labels.csv"])
        order = random.Random(4).sample(train, len(train))
        for p in order[:TRIGGER_FILES - 1]:
            assert _sha(_read(client, p)) == _sha(files[p])
        scan.wait(30)
        assert scan.started == [] and scan._too_large == {""}
        for p in order[TRIGGER_FILES - 1:2 * TRIGGER_FILES - 1]:
            assert _sha(_read(client, p)) == _sha(files[p])
        scan.wait(30)
        assert scan.started == ["train"] and _cached(client, train) == train
    finally:
        client.close()
        paths.close()


def test_a_look_at_a_few_files_of_a_large_tree_loads_nothing_until_a_share_of_it_is_read(tmp_path, datacache_home):
    """16 of 1,200 non-empty files (1.3 % < MIN_FRACTION) are a look, not a scan; the 24th file
    read makes 2 % and the tree is warmed. Empty files (400 more) are neither counted nor sampled."""
    from datacache.scan_warmup import MIN_FRACTION

    files = {}
    (tmp_path / "src" / "tiles").mkdir(parents=True)
    for k in range(1600):
        data = os.urandom(500 + k) if k % 4 else b""  # a quarter of the files empty (sidecars)
        (tmp_path / "src" / "tiles" / f"{k:04d}.bin").write_bytes(data)
        files[f"tiles/{k:04d}.bin"] = data
    apply_dataset(datacache_home, "pics", [{"name": "src", "mountPoint": f"local://{tmp_path / 'src'}"}]).close()
    full = sorted(p for p, d in files.items() if d)
    needed = int(MIN_FRACTION * len(full) + 0.999)
    assert TRIGGER_FILES < needed
    order = random.Random(6).sample(full, len(full))
    paths = read_path(str(datacache_home))
    client = paths.open_dataset("pics")
    try:
        scan = _listener(client)
        for p in order[:TRIGGER_FILES]:
            assert _sha(_read(client, p)) == _sha(files[p])
        scan.wait(30)
        assert scan.started == [] and _cached(client, full) == sorted(order[:TRIGGER_FILES])
        for p in order[TRIGGER_FILES:needed]:
            assert _sha(_read(client, p)) == _sha(files[p])
        scan.wait(30)
        assert scan.started == ["tiles"] and _cached(client, full) == full
    finally:
        client.close()
        paths.close()


def test_closing_during_a_stalled_warmup_is_prompt_and_reports_no_damage(tmp_path, datacache_home, monkeypatch,
                                                                       caplog):
    """The UFS stalls 4 s a read on the warmup's threads: close() returns within the grace and the
    wait for abandoned loads (CLOSE_WAIT_S, all together), and their late writes into the closed
    store report nothing (no tier marked unhealthy)."""
    import logging
    import threading
    import time

    from datacache.scan_warmup import CLOSE_WAIT_S
    from datacache.ufs.mounts import UnionNamespace

    files = _local(tmp_path, datacache_home)
    train = sorted(p for p in files if p.startswith("train/"))
    read = UnionNamespace.read

    def stalling(self, *args, **kwargs):
        if threading.current_thread().name.startswith("datacache-warmup"):
            time.sleep(4)
        return read(self, *args, **kwargs)

    monkeypatch.setattr(UnionNamespace, "read", stalling)
    caplog.set_level(logging.INFO, logger="datacache")
    paths = read_path(str(datacache_home))
    client = paths.open_dataset("pics")
    scan = _listener(client)
    for p in random.Random(8).sample(train, TRIGGER_FILES):
        assert _sha(_read(client, p)) == _sha(files[p])
    deadline = time.monotonic() + 10
    while not scan.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert scan.started == ["train"]
    t0 = time.monotonic()
    client.close()
    took = time.monotonic() - t0
    paths.close()
    time.sleep(4.5)  # the abandoned loads end, against a closed store
    assert took < CLOSE_WAIT_S + 1.5
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert any("scan warmup of dataset 'pics' under 'train': cancelled" in r.getMessage() for r in caplog.records)


def test_the_scan_lock_is_released_even_when_a_child_forked_while_it_was_held(tmp_path):
    """A DataLoader worker forked during a warmup shares the lock's open file: the lock is let go
    explicitly, so another process takes it at once after the warmup, the child still alive."""
    import time

    from datacache.scan_warmup import _exclusive

    path = str(tmp_path / "scan-warmup.lock")
    with _exclusive(path) as mine:
        assert mine
        child = os.fork()
        if child == 0:  # the forked worker: lives on past the warmup
            time.sleep(3)
            os._exit(0)
    try:
        other = os.open(path, os.O_RDWR)
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises BlockingIOError if still held
        finally:
            os.close(other)
        assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)


def test_a_path_is_under_a_tree_only_at_a_directory_boundary():
    from datacache.scan_warmup import _under

    assert _under("a/b/c.jpg", {"a/b"}) and _under("a/b/c.jpg", {"a"}) and _under("x.jpg", {""})
    assert not _under("a/bc/d.jpg", {"a/b"})  # a sibling whose name starts alike
    assert not _under("a/b", {"a/b"})  # the tree's own path is no file below it
    assert not _under("a/b/c.jpg", {"a/b/c.jpg", "b", "a/c"}) and not _under("c.jpg", set())
