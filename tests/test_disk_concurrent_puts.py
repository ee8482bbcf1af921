"""The SSD tier's puts write their bytes outside its lock: a block being written is reserved (it
counts against the quota, no reader sees it), other puts complete meanwhile, a block removed while
it is written leaves nothing behind, and a put killed mid-way is swept at a later open."""

from __future__ import annotations

import array
import hashlib
import os
import sqlite3
import subprocess
import sys
import threading

import pytest

from datacache.cache import disk as disk_module
from datacache.cache.disk import DiskTier

BLOCK = 4 << 20


def _cache_files(path: str) -> list[str]:
    files = os.path.join(path, disk_module.FILES)
    return sorted(os.listdir(files)) if os.path.isdir(files) else []


def _stored_bytes(path: str) -> int:
    with sqlite3.connect(os.path.join(path, disk_module.INDEX)) as db:
        return db.execute("SELECT bytes FROM totals").fetchone()[0]


class _HeldWrite:
    """Holds the first ``write_range`` of the tier in a put (before or after its bytes are written)
    until :meth:`release`; later writes go straight through."""

    def __init__(self, monkeypatch, after: bool):
        self.started, self._go, self._after, self._first = threading.Event(), threading.Event(), after, True
        real = disk_module.write_range

        def held(*args, **kwargs):
            first, self._first = self._first, False
            if first and not self._after:
                self.started.set()
                self._go.wait(30)
            real(*args, **kwargs)
            if first and self._after:
                self.started.set()
                self._go.wait(30)

        monkeypatch.setattr(disk_module, "write_range", held)

    def release(self) -> None:
        self._go.set()


def _put_in_thread(tier: DiskTier, key: str, data: bytes) -> tuple[threading.Thread, list]:
    result: list = []
    thread = threading.Thread(target=lambda: result.append(tier.put(key, data)))
    thread.start()
    return thread, result


def test_a_put_writing_its_bytes_holds_no_lock_and_its_block_is_reserved_but_unseen(tmp_path, monkeypatch):
    path = str(tmp_path / "ssd")
    tier = DiskTier(path, 64 << 20)
    first, second = os.urandom(BLOCK), os.urandom(BLOCK)
    held = _HeldWrite(monkeypatch, after=True)
    try:
        thread, result = _put_in_thread(tier, "ds/a/0", first)
        assert held.started.wait(30)
        # Its bytes are on disk, its row is reserved: counted, not readable, not listed.
        assert _stored_bytes(path) == BLOCK
        assert "ds/a/0" not in tier and tier.get("ds/a/0") is None and list(tier.keys()) == []
        assert tier.prefix_bytes("ds/") == 0
        # Another put completes while the first one is still in its write (no lock held).
        assert tier.put("ds/b/0", second)
        assert hashlib.sha256(tier.get("ds/b/0")).digest() == hashlib.sha256(second).digest()
        assert thread.is_alive()
        held.release()
        thread.join(30)
        assert result == [True]
        assert hashlib.sha256(tier.get("ds/a/0")).digest() == hashlib.sha256(first).digest()
        assert sorted(tier.keys()) == ["ds/a/0", "ds/b/0"] and _stored_bytes(path) == 2 * BLOCK
    finally:
        held.release()
        tier.close()


def test_the_quota_counts_the_blocks_being_written_and_may_evict_them(tmp_path, monkeypatch):
    path, quota = str(tmp_path / "ssd"), 40 << 20  # high watermark 38 MiB: 9 blocks
    tier = DiskTier(path, quota, high=0.95, low=0.7)
    held = _HeldWrite(monkeypatch, after=True)
    try:
        thread, result = _put_in_thread(tier, "ds/held/0", os.urandom(BLOCK))
        assert held.started.wait(30)
        assert _stored_bytes(path) == BLOCK  # counted from its reservation on
        for i in range(12):
            assert tier.put(f"ds/f{i}/0", os.urandom(BLOCK))
            assert tier.used() <= quota * 0.95
        # The reserved block was the least recently used: evicted like any other, so its put
        # stores nothing and its bytes are freed.
        held.release()
        thread.join(30)
        assert result == [False] and tier.get("ds/held/0") is None
        assert len(_cache_files(path)) == len(list(tier.keys())) == _stored_bytes(path) // BLOCK
        assert tier.used() <= quota * 0.95
    finally:
        held.release()
        tier.close()


def test_a_put_evicted_while_it_writes_leaves_the_block_to_the_put_that_reserved_it_anew(tmp_path, monkeypatch):
    """Eviction punched the range of a block being written (zeroing pages a mapped write had
    copied) and a second put reserved the block anew. The first put's completion must not complete
    the second one's reservation before that one wrote (it did: the block then failed its checksum
    and was dropped): it stores nothing, and the second stores the block."""
    path = str(tmp_path / "ssd")
    tier = DiskTier(path, 64 << 20)
    data = os.urandom(BLOCK)
    real = disk_module.write_range
    first_wrote, release_first, second_started, release_second = (threading.Event() for _ in range(4))
    calls = []

    def gated(*args, **kwargs):
        calls.append(args[1])
        if len(calls) == 1:  # the first put: writes, then waits to complete
            real(*args, **kwargs)
            first_wrote.set()
            release_first.wait(30)
        else:  # the second: waits before writing
            second_started.set()
            release_second.wait(30)
            real(*args, **kwargs)
        return True

    monkeypatch.setattr(disk_module, "write_range", gated)
    try:
        first, first_result = _put_in_thread(tier, "ds/x/0", data)
        assert first_wrote.wait(30)
        with tier._exclusive():
            tier._evict_to(0)  # the reserved block is the least recently used: its range punched
        second, second_result = _put_in_thread(tier, "ds/x/0", data)
        assert second_started.wait(30)
        release_first.set()
        first.join(30)
        assert first_result == [False] and tier.get("ds/x/0") is None and tier.corrupt == 0
        release_second.set()
        second.join(30)
        assert second_result == [True]
        assert hashlib.sha256(tier.get("ds/x/0")).digest() == hashlib.sha256(data).digest()
    finally:
        release_first.set()
        release_second.set()
        tier.close()


def test_a_put_finding_its_block_reserved_by_a_put_that_died_stores_it(tmp_path, monkeypatch):
    """A reservation whose put never completes (killed) does not keep the block out of the cache
    until the reservation is swept: the next put of the block writes and completes it."""
    path = str(tmp_path / "ssd")
    child = subprocess.run([sys.executable, "-c", _KILLED_MID_PUT, path], capture_output=True, text=True,
                           timeout=60, check=False)
    assert child.returncode == 9, child.stderr
    tier = DiskTier(path, 64 << 20)  # the reservation is young: kept at open
    data = os.urandom(BLOCK)
    try:
        assert "ds/killed/0" not in tier
        assert tier.put("ds/killed/0", data)
        assert hashlib.sha256(tier.get("ds/killed/0")).digest() == hashlib.sha256(data).digest()
        assert list(tier.keys()) == ["ds/killed/0"] and len(_cache_files(path)) == 1
    finally:
        tier.close()


@pytest.mark.parametrize("after", [False, True], ids=["removed-before-the-write", "removed-after-the-write"])
def test_a_block_removed_while_it_is_written_is_not_stored_and_leaves_no_bytes(tmp_path, monkeypatch, after):
    path = str(tmp_path / "ssd")
    tier = DiskTier(path, 64 << 20)
    kept = os.urandom(BLOCK)
    held = _HeldWrite(monkeypatch, after=after)
    try:
        thread, result = _put_in_thread(tier, "ds/gone/0", os.urandom(BLOCK))
        assert held.started.wait(30)
        assert len(_cache_files(path)) == (1 if after else 0)
        tier.discard("ds/gone/0")  # e.g. a dataset deleted, a hand-off to its owner
        held.release()
        thread.join(30)
        assert result == [False]
        assert tier.get("ds/gone/0") is None and _cache_files(path) == [] and _stored_bytes(path) == 0
        assert tier.put("ds/gone/0", kept)  # stored anew, in a file of its own
        assert hashlib.sha256(tier.get("ds/gone/0")).digest() == hashlib.sha256(kept).digest()
    finally:
        held.release()
        tier.close()


_KILLED_MID_PUT = """
import os, sys
from datacache.cache import disk
real = disk.write_range
def write_then_die(*args, **kwargs):
    real(*args, **kwargs)
    os._exit(9)  # killed between the bytes and the row's checksum
disk.write_range = write_then_die
disk.DiskTier(sys.argv[1], 64 << 20).put("ds/killed/0", os.urandom(4 << 20))
"""


def test_a_put_killed_between_its_bytes_and_its_checksum_is_swept_at_a_later_open(tmp_path, monkeypatch):
    path = str(tmp_path / "ssd")
    child = subprocess.run([sys.executable, "-c", _KILLED_MID_PUT, path], capture_output=True, text=True,
                           timeout=60, check=False)
    assert child.returncode == 9, child.stderr
    with sqlite3.connect(os.path.join(path, disk_module.INDEX)) as db:
        assert db.execute("SELECT file, idx, digest FROM blocks").fetchall() == [("ds/killed", 0, "")]
    assert len(_cache_files(path)) == 1 and _stored_bytes(path) == BLOCK
    monkeypatch.setattr(disk_module, "ORPHAN_GRACE_S", 0.0)  # the reservation counts as old now
    tier = DiskTier(path, 64 << 20)  # drops the reservation at open
    try:
        assert _cache_files(path) == [] and _stored_bytes(path) == 0 and list(tier.keys()) == []
        data = os.urandom(BLOCK)
        assert tier.put("ds/killed/0", data)
        assert hashlib.sha256(tier.get("ds/killed/0")).digest() == hashlib.sha256(data).digest()
    finally:
        tier.close()


def test_a_block_given_as_a_buffer_of_wider_items_is_stored_whole_and_an_empty_one_is_not(tmp_path):
    """``len`` of an ``array('i')`` counts items, not bytes: the reservation must be its bytes."""
    tier = DiskTier(str(tmp_path / "ssd"), 64 << 20, block_size=1 << 20)
    data = array.array("i", range(65536))  # 256 KiB, 65,536 items
    try:
        assert tier.put(f"ds/{'w' * 32}/0", data)
        assert bytes(tier.get(f"ds/{'w' * 32}/0")) == data.tobytes()
        assert tier.put(f"ds/{'e' * 32}/0", b"") is False and f"ds/{'e' * 32}/0" not in tier
    finally:
        tier.close()
