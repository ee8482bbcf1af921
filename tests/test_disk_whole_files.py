"""One cache file per file version (issue 17 item 4): blocks land at their offsets in one sparse
file; a version whose blocks are all stored is handed out whole (checked block by block the first
time), and from then on is evicted only by unlink, so a reader holding it open keeps reading the
right bytes; a file never handed out loses single blocks by hole punching, which frees their space
(a file larger than the quota, case C1)."""

from __future__ import annotations

import hashlib
import os

import pytest

from datacache.cache import disk
from datacache.cache.blocks import checksum
from datacache.cache.disk import DiskTier
from datacache.cache.extents import digest_range, write_range
from support import loop_mounted

BLOCK = 256 << 10
FILE = "ds/" + "a" * 32


def _sha(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _allocated(path: str) -> int:
    return os.stat(path).st_blocks * 512


def _fill(tier: DiskTier, file: str, blocks: list[bytes]) -> None:
    for i in reversed(range(len(blocks))):  # last first: each block lands at its offset
        assert tier.put(f"{file}/{i}", blocks[i])


def test_a_complete_version_is_one_contiguous_file_handed_out_after_its_check(tmp_path):
    tier = DiskTier(str(tmp_path / "ssd"), 64 * BLOCK, block_size=BLOCK)
    blocks = [os.urandom(BLOCK) for _ in range(4)] + [os.urandom(1000)]
    whole = b"".join(blocks)
    try:
        for i in (4, 2, 3, 1):  # any order: each block lands at its offset
            assert tier.put(f"{FILE}/{i}", blocks[i])
        assert tier.open_whole(FILE, len(whole), 5) is None  # block 0 missing: a hole
        path = tier.block_file(f"{FILE}/1")
        assert os.path.getsize(path) == len(whole) and _allocated(path) < len(whole)
        assert tier.put(f"{FILE}/0", blocks[0])
        assert tier.open_whole(FILE, len(whole) + 1, 5) is None  # not the version asked for
        fd = tier.open_whole(FILE, len(whole), 5)
        with open(fd, "rb") as f:
            assert _sha(f.read()) == _sha(whole)
        assert tier.block_file(f"{FILE}/4") == path and len(os.listdir(tier.files)) == 1
    finally:
        tier.close()


def _checks(tier: DiskTier) -> list[str]:
    """The files ``tier`` checks block by block from now on (its :meth:`DiskTier._check_whole` calls)."""
    checked, inner = [], tier._check_whole

    def check(file, *args):
        checked.append(file)
        return inner(file, *args)
    tier._check_whole = check
    return checked


def test_a_file_is_checked_once_a_boot_and_again_when_changed_behind_the_cache_or_after_a_reboot(tmp_path, monkeypatch):
    """The first hand-out of a file in a boot checks it; another process of that boot (here a second
    instance) trusts that check while the cache file is the one checked; a file changed behind the
    cache since (here a byte of block 2: its change time moves) is checked again and the damage
    found; after a reboot (a new ``boot_id``: set here, as a test cannot reboot) every file is
    checked again."""
    directory = str(tmp_path / "ssd")
    blocks = [os.urandom(BLOCK) for _ in range(3)]
    tier = DiskTier(directory, 64 * BLOCK, block_size=BLOCK)
    try:
        _fill(tier, FILE, blocks)
        os.close(tier.open_whole(FILE, 3 * BLOCK, 3))  # checked once by this instance
    finally:
        tier.close()
    tier = DiskTier(directory, 64 * BLOCK, block_size=BLOCK)  # another process, the same boot
    try:
        checks = _checks(tier)
        os.close(tier.open_whole(FILE, 3 * BLOCK, 3))  # checked in this boot already: handed out
        assert checks == [] and tier.corrupt == 0
    finally:
        tier.close()
    (name,) = os.listdir(tier.files)
    path = os.path.join(tier.files, name)
    with open(path, "r+b") as f:  # a byte of block 2 changed behind the cache
        f.seek(2 * BLOCK + 5)
        f.write(bytes([blocks[2][5] ^ 0xFF]))
    tier = DiskTier(directory, 64 * BLOCK, block_size=BLOCK)
    try:
        assert tier.open_whole(FILE, 3 * BLOCK, 3) is None
        assert tier.corrupt == 1 and f"{FILE}/2" not in tier
        # The file was handed out before: dropping one block unlinks it whole, never edits it.
        assert not os.path.exists(path) and f"{FILE}/0" not in tier
        _fill(tier, FILE, blocks)
        fd = tier.open_whole(FILE, 3 * BLOCK, 3)
        with open(fd, "rb") as f:
            assert _sha(f.read()) == _sha(b"".join(blocks))
    finally:
        tier.close()
    mark = disk.boot_mark()
    monkeypatch.setattr(disk, "boot_mark", lambda: mark ^ 4)  # a reboot
    tier = DiskTier(directory, 64 * BLOCK, block_size=BLOCK)
    try:
        checks = _checks(tier)
        with open(tier.open_whole(FILE, 3 * BLOCK, 3), "rb") as f:
            assert _sha(f.read()) == _sha(b"".join(blocks))
        assert checks == [FILE]
    finally:
        tier.close()


def test_the_first_hand_out_check_reads_every_piece_of_blocks_larger_than_its_buffer(tmp_path):
    """The check reads a block a piece (1 MiB) at a time through one buffer: a byte changed in the
    last, short piece of a block of several pieces still fails it, and a whole one equals the
    block's checksum (``digest_range`` against ``checksum``), at EOF too."""
    big = (3 << 20) + 12345  # three whole pieces and a short one
    directory = str(tmp_path / "ssd")
    blocks = [os.urandom(big), os.urandom(big), os.urandom(777)]
    tier = DiskTier(directory, 16 * big, block_size=big)
    try:
        _fill(tier, FILE, blocks)
        (name,) = os.listdir(tier.files)
        path = os.path.join(tier.files, name)
        fd = os.open(path, os.O_RDONLY)
        try:
            assert digest_range(fd, big, big) == checksum(blocks[1])
            assert digest_range(fd, 2 * big, big) == checksum(blocks[2])  # short at EOF
        finally:
            os.close(fd)
        with open(path, "r+b") as f:
            f.seek(2 * big - 7)  # block 1, its last piece
            f.write(bytes([blocks[1][-7] ^ 0xFF]))
        assert tier.open_whole(FILE, 2 * big + 777, 3) is None
        assert tier.corrupt == 1 and f"{FILE}/1" not in tier and f"{FILE}/0" in tier
    finally:
        tier.close()


def test_a_reader_keeps_its_bytes_when_the_file_it_holds_open_is_evicted(tmp_path):
    tier = DiskTier(str(tmp_path / "ssd"), 12 * BLOCK, high=0.95, low=0.5, block_size=BLOCK)
    blocks = [os.urandom(BLOCK) for _ in range(8)]
    try:
        _fill(tier, FILE, blocks)
        fd = tier.open_whole(FILE, 8 * BLOCK, 8)
        path = tier.block_file(f"{FILE}/0")
        first = os.pread(fd, BLOCK, 0)
        other = "ds/" + "b" * 32
        for i in range(8):  # the handed-out file is the least recently used: it goes whole
            assert tier.put(f"{other}/{i}", os.urandom(BLOCK))
        assert not os.path.exists(path) and not any(f"{FILE}/{i}" in tier for i in range(8))
        assert os.fstat(fd).st_nlink == 0  # unlinked, not truncated nor punched
        rest = b"".join(os.pread(fd, BLOCK, i * BLOCK) for i in range(1, 8))
        assert _sha(first + rest) == _sha(b"".join(blocks))
        os.close(fd)
        assert tier.used() <= 12 * BLOCK
    finally:
        tier.close()


def test_a_file_larger_than_the_quota_loses_single_blocks_by_hole_punching(tmp_path):
    quota = 10 * BLOCK
    tier = DiskTier(str(tmp_path / "ssd"), quota, high=0.95, low=0.7, block_size=BLOCK)
    blocks = [os.urandom(BLOCK) for _ in range(24)]  # 2.4x the quota, one file version
    try:
        for i, value in enumerate(blocks):
            assert tier.put(f"{FILE}/{i}", value)
            path = tier.block_file(f"{FILE}/{i}")
            assert _allocated(path) <= quota  # holes punched: the space is freed, not just unindexed
        kept = [i for i in range(24) if f"{FILE}/{i}" in tier]
        assert kept == list(range(24 - len(kept), 24)) and 0 < len(kept) < 10  # least recent went first
        assert _allocated(path) == len(kept) * BLOCK and os.path.getsize(path) == 24 * BLOCK
        assert all(_sha(tier.get(f"{FILE}/{i}")) == _sha(blocks[i]) for i in kept)
        assert tier.get(f"{FILE}/0") is None and tier.corrupt == 0  # a hole is a miss, not damage
        assert tier.open_whole(FILE, 24 * BLOCK, 24) is None  # never handed out while not complete
    finally:
        tier.close()


class _CountingQueries:
    """The tier's lookup connection, counting the statements run through it."""

    def __init__(self, inner):
        self.inner, self.statements = inner, []

    def execute(self, sql, *args):
        self.statements.append(sql)
        return self.inner.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_file_handed_out_before_is_opened_again_without_a_query_until_it_is_evicted(tmp_path):
    directory = str(tmp_path / "ssd")
    old, new = [os.urandom(BLOCK) for _ in range(2)], [os.urandom(BLOCK) for _ in range(2)]
    tier, other = DiskTier(directory, 64 * BLOCK, block_size=BLOCK), DiskTier(directory, 64 * BLOCK, block_size=BLOCK)
    try:
        _fill(tier, FILE, old)
        os.close(tier.open_whole(FILE, 2 * BLOCK, 2))  # checked, marked handed out
        counting = tier._ro = _CountingQueries(tier._ro)
        for _ in range(3):
            with open(tier.open_whole(FILE, 2 * BLOCK, 2), "rb") as f:
                assert _sha(f.read()) == _sha(b"".join(old))
        assert counting.statements == []
        # Another process evicts it (whole: it was handed out) and stores the version anew.
        other.discard(f"{FILE}/0")
        assert os.listdir(tier.files) == []
        _fill(other, FILE, new)
        fd = tier.open_whole(FILE, 2 * BLOCK, 2)  # the name it remembered is gone: looked up again
        with open(fd, "rb") as f:
            assert _sha(f.read()) == _sha(b"".join(new))
        assert counting.statements != []
    finally:
        tier.close()
        other.close()


@pytest.fixture(params=["tmp", "ext4 with whole-second times"])
def cache_fs(request, tmp_path):
    """A directory for a tier: on the test's file system, and on an ext4 with 128-byte inodes,
    whose change times are whole seconds (loop device, root only)."""
    if request.param == "tmp":
        yield tmp_path
    else:
        yield from loop_mounted(tmp_path, ["mkfs.ext4", "-q", "-F", "-I", "128"], 64 << 20, "ext4")


def test_a_handed_out_file_made_anew_under_its_name_by_a_put_in_flight_is_not_handed_out(cache_fs, monkeypatch):
    """A put that reserved a block before its file was evicted writes after: ``O_CREAT`` makes the
    file anew under the remembered name, with only that block (zeros before it), until the put
    learns its row went. Neither the remembered hand-out nor a learnt one may open it, also where
    ext4 hands the freed inode back and the change time is the same second."""
    monkeypatch.setattr(disk, "LEARN_HANDED_AFTER", 1)
    directory = str(cache_fs / "ssd")
    blocks = [os.urandom(BLOCK) for _ in range(2)]
    tier, other = DiskTier(directory, 64 * BLOCK, block_size=BLOCK), DiskTier(directory, 64 * BLOCK, block_size=BLOCK)
    learnt = DiskTier(directory, 64 * BLOCK, block_size=BLOCK)
    try:
        _fill(tier, FILE, blocks)
        path = tier.block_file(f"{FILE}/1")
        os.close(tier.open_whole(FILE, 2 * BLOCK, 2))  # checked, remembered
        os.close(learnt.open_whole(FILE, 2 * BLOCK, 2))  # learnt from the index
        assert FILE in tier._handed and FILE in learnt._handed
        other.discard(f"{FILE}/0")  # evicted whole by another process
        write_range(path, BLOCK, blocks[1], 0o600)  # the put in flight writes its block
        assert os.path.getsize(path) == 2 * BLOCK
        assert tier.open_whole(FILE, 2 * BLOCK, 2) is None and learnt.open_whole(FILE, 2 * BLOCK, 2) is None
        assert tier.get(f"{FILE}/0") is None and tier.get(f"{FILE}/1") is None
    finally:
        tier.close()
        other.close()
        learnt.close()


def test_a_handed_out_file_truncated_behind_the_cache_is_not_handed_out_short(tmp_path):
    tier = DiskTier(str(tmp_path / "ssd"), 64 * BLOCK, block_size=BLOCK)
    blocks = [os.urandom(BLOCK) for _ in range(2)]
    try:
        _fill(tier, FILE, blocks)
        os.close(tier.open_whole(FILE, 2 * BLOCK, 2))
        os.truncate(tier.block_file(f"{FILE}/0"), BLOCK)
        assert tier.open_whole(FILE, 2 * BLOCK, 2) is None
        assert tier.get(f"{FILE}/0") == blocks[0]  # the first block is intact
    finally:
        tier.close()


def test_a_handed_out_file_truncated_and_extended_behind_the_cache_is_not_handed_out_with_zeros(tmp_path, monkeypatch):
    """Its size is right again, but its second block is a hole: the process that checked it, one
    that learnt it and one that asks the index all see a file that is not the one checked."""
    monkeypatch.setattr(disk, "LEARN_HANDED_AFTER", 1)
    directory = str(tmp_path / "ssd")
    tier, learnt = DiskTier(directory, 64 * BLOCK, block_size=BLOCK), DiskTier(directory, 64 * BLOCK, block_size=BLOCK)
    try:
        _fill(tier, FILE, [os.urandom(BLOCK) for _ in range(2)])
        os.close(tier.open_whole(FILE, 2 * BLOCK, 2))
        os.close(learnt.open_whole(FILE, 2 * BLOCK, 2))
        path = tier.block_file(f"{FILE}/0")
        os.truncate(path, BLOCK)
        os.truncate(path, 2 * BLOCK)
        asking = DiskTier(directory, 64 * BLOCK, block_size=BLOCK)
        try:
            assert [t.open_whole(FILE, 2 * BLOCK, 2) for t in (asking, tier, learnt)] == [None, None, None]
        finally:
            asking.close()
        assert f"{FILE}/1" not in tier and not os.path.exists(path)  # found by the check, dropped whole
    finally:
        tier.close()
        learnt.close()


def test_the_files_remembered_as_handed_out_stay_bounded_and_each_is_still_handed_out_right(tmp_path, monkeypatch):
    monkeypatch.setattr(disk, "HANDED_KEPT", 3)
    tier = DiskTier(str(tmp_path / "ssd"), 64 * BLOCK, block_size=BLOCK)
    files = {f"ds/{n:032x}": os.urandom(BLOCK - n) for n in range(8)}
    try:
        for file, data in files.items():
            _fill(tier, file, [data])
        for _ in range(2):  # the second round finds some remembered, asks the index for the others
            for file, data in files.items():
                with open(tier.open_whole(file, len(data), 1), "rb") as f:
                    assert _sha(f.read()) == _sha(data)
                assert len(tier._handed) <= 3
    finally:
        tier.close()


def test_a_process_learns_this_boots_hand_outs_at_once_and_opens_them_with_no_query(tmp_path, monkeypatch):
    monkeypatch.setattr(disk, "LEARN_HANDED_AFTER", 2)
    directory = str(tmp_path / "ssd")
    files = {f"ds/{n:032x}": os.urandom(BLOCK - n) for n in range(6)}
    tier, other = DiskTier(directory, 64 * BLOCK, block_size=BLOCK), DiskTier(directory, 64 * BLOCK, block_size=BLOCK)
    try:
        for file, data in files.items():
            _fill(tier, file, [data])
            os.close(tier.open_whole(file, len(data), 1))  # checked and marked handed out, with what it saw
        counting = other._ro = _CountingQueries(other._ro)
        for file, data in files.items():  # another process: asks for the first, learns them all at the second
            with open(other.open_whole(file, len(data), 1), "rb") as f:
                assert _sha(f.read()) == _sha(data)
        assert len(counting.statements) == 2 and "handed IS NOT NULL" in counting.statements[1]
        # One is evicted (whole) and stored anew under another name: the learnt name is gone, asked again.
        first, data = next(iter(files.items()))
        tier.discard(f"{first}/0")
        _fill(tier, first, [data])
        with open(other.open_whole(first, len(data), 1), "rb") as f:
            assert _sha(f.read()) == _sha(data)
        assert len(counting.statements) == 3
    finally:
        tier.close()
        other.close()


def test_past_the_hand_outs_it_keeps_a_process_asks_for_a_file_s_own_row_not_its_blocks(tmp_path, monkeypatch):
    """A worker opening more files than HANDED_KEPT (here 2) and before it learns (LEARN_HANDED_AFTER
    here 1,024) asks the index for each file's hand-out by its row alone: one statement a file, none
    of them reading block rows. A file changed behind the cache since (truncated and extended: the
    size is right, the second block a hole) fails that identity and is asked for and checked whole."""
    monkeypatch.setattr(disk, "HANDED_KEPT", 2)
    monkeypatch.setattr(disk, "LEARN_HANDED_AFTER", 1024)
    directory = str(tmp_path / "ssd")
    files = {f"ds/{n:032x}": [os.urandom(BLOCK), os.urandom(BLOCK - n)] for n in range(6)}
    tier, other = DiskTier(directory, 64 * BLOCK, block_size=BLOCK), DiskTier(directory, 64 * BLOCK, block_size=BLOCK)
    try:
        for file, blocks in files.items():
            _fill(tier, file, blocks)
            os.close(tier.open_whole(file, sum(map(len, blocks)), 2))  # checked, marked with its identity
        counting = other._ro = _CountingQueries(other._ro)
        for _ in range(2):
            for file, blocks in files.items():
                with open(other.open_whole(file, sum(map(len, blocks)), 2), "rb") as f:
                    assert _sha(f.read()) == _sha(b"".join(blocks))
                assert len(other._handed) <= 2
        assert len(counting.statements) == 12 and all("JOIN" not in q for q in counting.statements)
        changed, blocks = next(iter(files.items()))  # not among the two kept
        assert changed not in other._handed
        path = tier.block_file(f"{changed}/0")
        os.truncate(path, BLOCK)
        os.truncate(path, sum(map(len, blocks)))
        counting.statements.clear()
        assert other.open_whole(changed, sum(map(len, blocks)), 2) is None
        assert ["JOIN" in q for q in counting.statements[:2]] == [False, True]  # its row, then its blocks
        assert f"{changed}/1" not in tier and not os.path.exists(path)  # found by the check, dropped whole
    finally:
        tier.close()
        other.close()


def test_an_index_made_before_the_handed_column_gets_it_and_its_hand_outs_are_asked_for(tmp_path, monkeypatch):
    import sqlite3

    monkeypatch.setattr(disk, "LEARN_HANDED_AFTER", 1)
    directory = str(tmp_path / "ssd")
    data = os.urandom(BLOCK)
    tier = DiskTier(directory, 64 * BLOCK, block_size=BLOCK)
    _fill(tier, FILE, [data])
    os.close(tier.open_whole(FILE, BLOCK, 1))
    tier.close()
    with sqlite3.connect(os.path.join(directory, disk.INDEX)) as db:  # the layout before the column
        db.execute("ALTER TABLE files DROP COLUMN handed")
    tier = DiskTier(directory, 64 * BLOCK, block_size=BLOCK)
    try:
        assert tier.healthy
        with sqlite3.connect(os.path.join(directory, disk.INDEX)) as db:
            assert [row[1] for row in db.execute("PRAGMA table_info(files)")][-1] == "handed"
        with open(tier.open_whole(FILE, BLOCK, 1), "rb") as f:  # marked in this boot, no identity: asked for
            assert _sha(f.read()) == _sha(data)
    finally:
        tier.close()


def test_a_process_that_learnt_little_at_first_learns_again_as_its_queries_double(tmp_path, monkeypatch):
    """A DataLoader worker's first epoch is cold: its first learning finds nothing handed out yet.
    What that epoch cached is learnt when its queries have doubled."""
    monkeypatch.setattr(disk, "LEARN_HANDED_AFTER", 2)
    directory = str(tmp_path / "ssd")
    files = {f"ds/{n:032x}": os.urandom(BLOCK - n) for n in range(6)}
    tier, other = DiskTier(directory, 64 * BLOCK, block_size=BLOCK), DiskTier(directory, 64 * BLOCK, block_size=BLOCK)
    try:
        for file, data in list(files.items())[:2]:  # cold: nothing stored yet
            assert other.open_whole(file, len(data), 1) is None
        for file, data in files.items():
            _fill(tier, file, [data])
            os.close(tier.open_whole(file, len(data), 1))
        counting = other._ro = _CountingQueries(other._ro)
        for file, data in files.items():  # the 3rd query asks for one, the 4th learns them all
            with open(other.open_whole(file, len(data), 1), "rb") as f:
                assert _sha(f.read()) == _sha(data)
        assert len(counting.statements) == 2 and "handed IS NOT NULL" in counting.statements[1]
    finally:
        tier.close()
        other.close()
