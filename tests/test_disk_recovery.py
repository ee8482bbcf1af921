"""The SSD tier's index, damaged or emptied under it: a damaged ``index.db`` is replaced by an empty
index (its cache files deleted) and the tier works; an emptied one leaves no unindexed cache file
outside the quota; a read-only directory still says how to fix it; the block-file layout of before
is deleted when found."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import sqlite3
import subprocess
import time

import pytest

from datacache.cache import disk as disk_module
from datacache.cache.disk import ORPHAN_GRACE_S, DiskTier
from support import du

BLOCK = 4 << 20
HAVE_MOUNT = os.geteuid() == 0 and shutil.which("mount") is not None


def _block_files(path: str) -> list[str]:
    """The cache files of the tier at ``path`` (one per file version; these tests store one block
    per file version)."""
    files = os.path.join(path, disk_module.FILES)
    return [os.path.join(files, n) for n in os.listdir(files)] if os.path.isdir(files) else []


def _bytes_under(path: str) -> int:
    return du(path)


def _filled(path: str, blocks: int) -> None:
    tier = DiskTier(path, 64 << 20)
    try:
        for i in range(blocks):
            assert tier.put(f"ds/f{i}/0", os.urandom(BLOCK))
    finally:
        tier.close()
    assert len(_block_files(path)) == blocks


def _garbage(db: str) -> None:  # what `head -c 4096 /dev/urandom > index.db` does
    with open(db, "wb") as f:
        f.write(os.urandom(4096))


def _malformed(db: str) -> None:  # a good header, garbage pages behind it
    with open(db, "r+b") as f:
        f.seek(4096)
        f.write(os.urandom(16384))


@pytest.mark.parametrize("damage, reason", [(_garbage, "file is not a database"),
                                            (_malformed, "database disk image is malformed")])
def test_a_damaged_index_is_replaced_and_the_tier_starts_empty_and_works(tmp_path, caplog, damage, reason):
    path = str(tmp_path / "ssd")
    _filled(path, 3)
    damage(os.path.join(path, "index.db"))
    with caplog.at_level(logging.WARNING, logger="datacache.cache.disk"):
        tier = DiskTier(path, 64 << 20)
    try:
        messages = [r.getMessage() for r in caplog.records]
        assert not any("cannot be used" in m for m in messages)  # not a permission problem
        warning = next(m for m in messages if "damaged" in m)
        assert path in warning and reason in warning and "starts empty" in warning
        assert tier.healthy and list(tier.keys()) == [] and tier.orphans_removed == 3
        assert _block_files(path) == []  # unverifiable without their checksums: gone
        value = os.urandom(BLOCK)
        assert tier.put("ds/g/0", value)
        assert hashlib.sha256(tier.get("ds/g/0")).digest() == hashlib.sha256(value).digest()
        assert len(_block_files(path)) == 1 and BLOCK < tier.used() <= _bytes_under(path)
    finally:
        tier.close()


def test_an_index_damaged_while_open_is_replaced_at_the_recheck(tmp_path, caplog, monkeypatch):
    path = str(tmp_path / "ssd")
    tier = DiskTier(path, 64 << 20)
    try:
        assert tier.put("ds/f0/0", os.urandom(BLOCK))
        with contextlib.closing(sqlite3.connect(os.path.join(path, "index.db"))) as con:
            con.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the rows are in the file now, not its WAL
        _garbage(os.path.join(path, "index.db"))
        assert tier.get("ds/f0/0") is None and not tier.healthy  # a miss: the UFS serves it
        monkeypatch.setattr(disk_module, "RECHECK_S", 0.0)
        value = os.urandom(BLOCK)
        with caplog.at_level(logging.WARNING, logger="datacache.cache.disk"):
            assert tier.put("ds/g/0", value)
        assert any("damaged (file is not a database)" in r.getMessage() for r in caplog.records)
        assert tier.healthy and list(tier.keys()) == ["ds/g/0"] and len(_block_files(path)) == 1
        assert hashlib.sha256(tier.get("ds/g/0")).digest() == hashlib.sha256(value).digest()
    finally:
        tier.close()


def test_an_emptied_index_sweeps_every_block_file_at_open_and_holds_the_quota(tmp_path):
    path, quota = str(tmp_path / "ssd"), 64 << 20
    _filled(path, 14)  # 56 MiB of young block files
    open(os.path.join(path, "index.db"), "wb").close()  # `: > index.db`
    tier = DiskTier(path, quota)
    try:
        assert tier.orphans_removed == 14 and _block_files(path) == []  # at once, whatever their age
        for i in range(30):  # a 120 MiB warmup
            assert tier.put(f"ds/w{i}/0", os.urandom(BLOCK))
        assert tier.used() <= quota and _bytes_under(path) <= quota
        assert len(_block_files(path)) == len(list(tier.keys())) == tier.used() // BLOCK
    finally:
        tier.close()


def test_a_second_open_of_a_directory_in_use_deletes_nothing(tmp_path):
    path = str(tmp_path / "ssd")
    first = DiskTier(path, 64 << 20)
    value = os.urandom(BLOCK)
    try:
        assert first.put("ds/f0/0", value)
        second = DiskTier(path, 64 << 20)  # the index has a row: no file is taken for an orphan
        try:
            assert second.orphans_removed == 0 and len(_block_files(path)) == 1
            assert hashlib.sha256(second.get("ds/f0/0")).digest() == hashlib.sha256(value).digest()
        finally:
            second.close()
    finally:
        first.close()


def test_the_sweeps_leave_the_workers_tiers_below_the_in_process_one_alone(tmp_path):
    base = str(tmp_path / "ssd")  # the in-process tier; a worker's tier is a directory below it
    worker = os.path.join(base, "worker-0")
    _filled(worker, 2)
    old = time.time() - ORPHAN_GRACE_S - 1
    for name in _block_files(worker):  # old enough for the grace-period sweep too
        os.utime(name, (old, old))
    tier = DiskTier(base, 64 << 20)  # a new, empty index of its own
    try:
        tier.sweeper.join(10)
        assert tier.orphans_removed == 0 and len(_block_files(worker)) == 2
    finally:
        tier.close()
    tier = DiskTier(worker, 64 << 20)
    try:
        assert all(len(tier.get(f"ds/f{i}/0")) == BLOCK for i in range(2))  # checksums verified
    finally:
        tier.close()


@pytest.mark.parametrize("damage", [None, _garbage])
def test_a_read_only_directory_keeps_the_cannot_be_used_message(tmp_path, caplog, damage):
    if not HAVE_MOUNT:
        pytest.skip("a read-only bind mount needs root and mount(8)")
    path = str(tmp_path / "ssd")
    _filled(path, 1)
    if damage:
        damage(os.path.join(path, "index.db"))
    subprocess.run(["mount", "--bind", path, path], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", path], check=True)
        with caplog.at_level(logging.WARNING, logger="datacache.cache.disk"):
            tier = DiskTier(path, 64 << 20)
        messages = [r.getMessage() for r in caplog.records]
        warning = next(m for m in messages if "cannot be used" in m)
        assert path in warning and "Read-only file system" in warning
        assert f"fix: remount the file system of {path} read-write" in warning
        assert not any("damaged" in m for m in messages)
        assert not tier.healthy and tier.get("ds/f0/0") is None and not tier.put("ds/f1/0", b"x")
        assert len(_block_files(path)) == 1  # nothing deleted
        tier.close()
    finally:
        subprocess.run(["umount", "-l", path], check=False)


def test_the_block_file_layout_of_before_is_deleted_at_open(tmp_path):
    path = str(tmp_path / "ssd")
    old = [os.path.join(path, "ab", "cd", f"{i:032x}.val") for i in range(3)]
    for name in old:
        os.makedirs(os.path.dirname(name), exist_ok=True)
        with open(name, "wb") as f:
            f.write(os.urandom(1000))
    with open(os.path.join(path, "cache.db"), "wb") as f:  # diskcache's index of those
        f.write(os.urandom(4096))
    _filled(os.path.join(path, "worker-0"), 1)  # a worker's tier below: not of that layout
    tier = DiskTier(path, 64 << 20)
    try:
        assert not any(os.path.exists(n) for n in old) and not os.path.exists(os.path.join(path, "ab"))
        assert not os.path.exists(os.path.join(path, "cache.db")) and tier.healthy
        assert len(_block_files(os.path.join(path, "worker-0"))) == 1
    finally:
        tier.close()
