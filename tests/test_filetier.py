"""The file tier (issue 17): complete file versions as contiguous local files. Bytes equal their
source; the quota holds while several processes write at once (cases C1, C2); least recently
used files go first; eviction unlinks under an open reader and an mmap; a killed writer leaves
no file under the final name and its temp is swept; damaged files are dropped; a file larger
than the quota is refused; a manifest entry is built only from cached blocks."""

from __future__ import annotations

import hashlib
import mmap
import multiprocessing
import os
import sqlite3
import stat
import threading
import time

import pytest

from datacache.cache import filetier
from datacache.cache.blocks import PieceBlock, file_id
from datacache.cache.filetier import FileTier, MissingBlock, materialize_entry
from support import apply_dataset, du

MiB = 1 << 20
BS = MiB  # block size the tests cut their files at
_FORK = multiprocessing.get_context("fork")


def fid(name: str) -> str:
    return file_id("local", name, "v1", BS)


def blocks(data: bytes, bs: int = BS):
    return (data[i:i + bs] for i in range(0, len(data), bs))


def sha(data) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha(path: str) -> str:
    with open(path, "rb") as f:
        return sha(f.read())


def entries(directory) -> set[str]:
    """Names of the data files (complete and temp) in a tier's directory."""
    return {n for n in os.listdir(directory) if not n.startswith((".", "index.db"))}


@pytest.mark.parametrize("size", [0, 1, BS - 1, BS + 1, 3 * BS])
def test_bytes_equal_the_blocks_and_survive_a_restart(tmp_path, size):
    data = os.urandom(size)
    d = tmp_path / "files"
    with FileTier(str(d), 64 * MiB) as tier:
        path = tier.materialize(fid("a"), size, blocks(data))
        assert path == os.path.join(str(d), fid("a")) == tier.path(fid("a"))
        assert file_sha(path) == sha(data) and os.path.getsize(path) == size
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
        assert tier.contains(fid("a")) and not tier.contains(fid("b"))
        assert tier.used() >= size
    with FileTier(str(d), 64 * MiB) as tier:  # written in this boot: trusted, handed out
        assert file_sha(tier.path(fid("a"))) == sha(data)
        assert tier.materialize(fid("a"), size, iter(())) == tier.path(fid("a"))  # already complete


def test_piece_blocks_and_wrong_totals(tmp_path):
    data = os.urandom(2 * BS + 5)
    with FileTier(str(tmp_path / "t"), 64 * MiB) as tier:
        pieced = (PieceBlock((b[:1000], b[1000:])) for b in blocks(data))
        assert file_sha(tier.materialize(fid("p"), len(data), pieced)) == sha(data)
        with pytest.raises(ValueError, match=r"blocks hold 2097157 bytes, 2097158 announced"):
            tier.materialize(fid("short"), len(data) + 1, blocks(data))
        with pytest.raises(ValueError, match=r"blocks hold more than the 2097156 bytes announced"):
            tier.materialize(fid("long"), len(data) - 1, blocks(data))
        assert entries(tier.directory) == {fid("p")}  # no temp file, no partial file left
        assert tier.used() < len(data) + 64 * 1024  # the two refused writes hold no reservation
        with pytest.raises(ValueError, match="malformed file id '../x'"):
            tier.path("../x")


def test_a_write_given_up_for_a_missing_block_leaves_nothing(tmp_path):
    data = os.urandom(3 * BS)

    def losing():
        yield data[:BS]
        raise MissingBlock("block 1 is no longer cached")

    with FileTier(str(tmp_path / "t"), 64 * MiB) as tier:
        assert tier.materialize(fid("m"), len(data), losing()) is None
        assert entries(tier.directory) == set() and tier.used() < 64 * 1024  # no temp, no reservation
        assert not tier.contains(fid("m"))
        assert file_sha(tier.materialize(fid("m"), len(data), blocks(data))) == sha(data)


def test_a_file_larger_than_the_quota_is_refused_with_nothing_written(tmp_path):
    def never():
        raise AssertionError("blocks read for a refused file")
        yield

    with FileTier(str(tmp_path / "t"), 8 * MiB) as tier:
        with pytest.raises(ValueError) as err:
            tier.materialize(fid("big"), 9 * MiB, never())
        assert str(err.value) == (f"file tier {tier.directory}: file {fid('big')} of 9437184 bytes does not fit: quota "
                                  "8388608 bytes, high watermark 7969177 bytes (raise the file tier's quota)")
        assert entries(tier.directory) == set() and not tier.contains(fid("big"))


def test_least_recently_used_files_are_evicted_first(tmp_path):
    data = {n: os.urandom(3 * MiB) for n in "abcde"}
    with FileTier(str(tmp_path / "t"), 10 * MiB, high=0.95, low=0.95) as tier:
        for n in "abc":
            tier.materialize(fid(n), 3 * MiB, blocks(data[n]))
        assert tier.path(fid("a"))  # a is now the most recently used
        tier.materialize(fid("d"), 3 * MiB, blocks(data["d"]))
        assert entries(tier.directory) == {fid("a"), fid("c"), fid("d")}  # b, the oldest, went
        assert tier.evictions == 1
    with FileTier(str(tmp_path / "t"), 10 * MiB, high=0.95, low=0.95) as tier:  # the order was stored
        tier.materialize(fid("e"), 3 * MiB, blocks(data["e"]))
        assert entries(tier.directory) == {fid("a"), fid("d"), fid("e")}
        for n in "ade":
            assert file_sha(tier.path(fid(n))) == sha(data[n])


def test_eviction_unlinks_under_an_open_reader_and_an_mmap(tmp_path):
    old, new = os.urandom(6 * MiB), os.urandom(6 * MiB)
    with FileTier(str(tmp_path / "t"), 10 * MiB) as tier:
        tier.materialize(fid("old"), len(old), blocks(old))
        fd = tier.open(fid("old"))
        mapped = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        try:
            assert mapped[:4096] == old[:4096]  # pages faulted in before the eviction, the rest after
            tier.materialize(fid("new"), len(new), blocks(new))
            assert tier.path(fid("old")) is None and entries(tier.directory) == {fid("new")}
            assert sha(mapped[:]) == sha(old)
            assert sha(os.pread(fd, len(old) + 1, 0)) == sha(old)
            assert os.fstat(fd).st_size == len(old) and os.fstat(fd).st_nlink == 0
        finally:
            mapped.close()
            os.close(fd)


def _write_and_die(directory: str, name: str, data: bytes) -> None:
    """Child: materialize ``data`` and die (``os._exit``) after its second block."""
    tier = FileTier(directory, 64 * MiB)

    def dying():
        for i, block in enumerate(blocks(data)):
            if i == 2:
                os._exit(9)
            yield block

    tier.materialize(fid(name), len(data), dying())


def test_a_killed_writer_leaves_no_final_file_and_its_temp_is_swept(tmp_path):
    d, data = str(tmp_path / "t"), os.urandom(4 * MiB)
    child = _FORK.Process(target=_write_and_die, args=(d, "k", data))
    child.start()
    child.join(60)
    assert child.exitcode == 9
    left = entries(d)
    assert len(left) == 1 and left.pop().startswith(fid("k") + ".")  # only its temp file
    assert not os.path.exists(os.path.join(d, fid("k")))
    with FileTier(d, 64 * MiB) as tier:  # the next open sweeps the temp and its reservation
        assert entries(d) == set() and tier.used() < 64 * 1024
        assert tier.path(fid("k")) is None
        assert file_sha(tier.materialize(fid("k"), len(data), blocks(data))) == sha(data)


def _write_slowly(directory: str, name: str, data: bytes, started, proceed) -> None:
    """Child: materialize ``data``, pausing after the first block until ``proceed`` is set."""
    tier = FileTier(directory, 64 * MiB)

    def paused():
        for i, block in enumerate(blocks(data)):
            if i == 1:
                started.set()
                proceed.wait(60)
            yield block

    tier.materialize(fid(name), len(data), paused())
    tier.close()


def test_a_live_writers_temp_is_kept_by_a_sweep_and_not_written_twice(tmp_path):
    d, data = str(tmp_path / "t"), os.urandom(3 * MiB)
    started, proceed = _FORK.Event(), _FORK.Event()
    child = _FORK.Process(target=_write_slowly, args=(d, "w", data, started, proceed))
    child.start()
    try:
        assert started.wait(60)
        with FileTier(d, 64 * MiB) as tier:  # opening sweeps, but this writer lives
            assert len(entries(d)) == 1 and tier.used() >= len(data)
            assert tier.materialize(fid("w"), len(data), blocks(data)) is None  # being written
            proceed.set()
            child.join(60)
            assert child.exitcode == 0
            assert file_sha(tier.path(fid("w"))) == sha(data) and entries(d) == {fid("w")}
    finally:
        proceed.set()
        child.join(60)


def test_a_damaged_file_is_dropped_by_verify_and_at_its_first_hand_out_after_a_reboot(tmp_path, caplog,
                                                                                       monkeypatch):
    """A file written or checked in this boot is trusted by the other processes of the boot (here
    a second instance); after a reboot (a new ``boot_id``: set here, as a test cannot reboot) its
    first hand-out checks it again and finds the damage."""
    d = str(tmp_path / "t")
    data = {n: os.urandom(2 * MiB + 3) for n in "abc"}
    with FileTier(d, 64 * MiB) as tier:
        for n in "abc":
            tier.materialize(fid(n), len(data[n]), blocks(data[n]))
        assert tier.verify() == []
    for n, flip_at in (("a", MiB + 1), ("b", 0)):
        with open(os.path.join(d, fid(n)), "r+b") as f:
            f.seek(flip_at)
            byte = f.read(1)
            f.seek(flip_at)
            f.write(bytes([byte[0] ^ 0x10]))
    with FileTier(d, 64 * MiB) as tier:  # another process of the same boot
        assert tier.path(fid("b")) == os.path.join(d, fid("b")) and tier.dropped == 0  # written this boot: trusted
    mark = filetier.boot_mark()
    monkeypatch.setattr(filetier, "boot_mark", lambda: mark ^ 4)  # a reboot
    with FileTier(d, 64 * MiB) as tier:
        assert tier.verify(fid("a")) == [fid("a")]
        assert tier.path(fid("b")) is None  # first hand-out in this boot: checked, dropped
        assert tier.dropped == 2 and entries(d) == {fid("c")}
        assert f"file tier {d}: file {fid('a')} failed its check (2097155 bytes and xxh3" in caplog.text
        assert not tier.contains(fid("a")) and not tier.contains(fid("b"))
        assert file_sha(tier.path(fid("c"))) == sha(data["c"])
        os.truncate(os.path.join(d, fid("c")), 5)  # a short file fails the scrub too
        assert tier.verify() == [fid("c")] and entries(d) == set() and tier.dropped == 3


def _fill_many(directory: str, quota: int, worker: int, count: int, size: int, results) -> None:
    """Child: two threads materialize ``count`` files each of ``size`` bytes; reports
    ``(worker, written, wrong)``: files written, and those whose bytes read back differed."""
    tier = FileTier(directory, quota)
    written, wrong = [], []

    def run(thread: int):
        for i in range(count):
            data = os.urandom(size)
            name = f"w{worker}-t{thread}-{i}"
            slow = (time.sleep(0.002) or b for b in blocks(data, 256 * 1024))  # keep writes in flight
            if tier.materialize(fid(name), size, slow) is None:
                continue
            written.append(name)
            fd = tier.open(fid(name))
            if fd is not None:  # None: already evicted by another writer
                try:
                    if sha(os.pread(fd, size + 1, 0)) != sha(data):
                        wrong.append(name)
                finally:
                    os.close(fd)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tier.close()
    results.put((worker, len(written), wrong))


def test_c2_quota_holds_while_four_processes_write_at_once(tmp_path):
    d, quota, size = str(tmp_path / "t"), 24 * MiB, 5 * MiB
    FileTier(d, quota).close()
    results = _FORK.Queue()
    children = [_FORK.Process(target=_fill_many, args=(d, quota, w, 4, size, results)) for w in range(4)]
    for c in children:
        c.start()
    peak, samples = 0, 0
    while any(c.is_alive() for c in children):
        peak = max(peak, du(d))  # every file under the directory: data, temps, index, lock
        samples += 1
    for c in children:
        c.join(60)
        assert c.exitcode == 0
    reports = [results.get(timeout=10) for _ in children]
    print(f"peak {peak} of {quota} bytes, {samples} samples")
    assert samples > 50
    assert peak <= quota, f"{peak} bytes on disk passed the {quota}-byte quota"
    assert all(wrong == [] for _, _, wrong in reports)
    assert sum(n for _, n, _ in reports) * size > 2 * quota  # evictions really ran
    with FileTier(d, quota) as tier:
        assert du(d) <= tier.used() <= quota
        assert all(tier.verify(n) == [] for n in entries(d))


def test_materialize_entry_only_from_cached_blocks(datacache_home, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(2 * 4 * MiB + 12345)
    (src / "f.bin").write_bytes(data)
    plane = apply_dataset(datacache_home, "ft", [{"name": "local", "mountPoint": str(src)}])
    client = plane.open_dataset("ft")
    source, entry = client.source, client.stat("f.bin")
    with FileTier(str(tmp_path / "files"), 64 * MiB) as tier:
        source.get(entry, 0)
        source.get(entry, 2)
        fetched = source.ufs_bytes
        assert materialize_entry(tier, source, entry) is None  # block 1 is not cached
        assert source.ufs_bytes == fetched and entries(tier.directory) == set()
        source.get(entry, 1)
        fetched = source.ufs_bytes
        path = materialize_entry(tier, source, entry)
        assert source.ufs_bytes == fetched  # nothing read from the UFS
        assert os.path.basename(path) == file_id(entry.mount, entry.ufs_path, entry.version, source.block_size)
        assert file_sha(path) == sha(data)
        assert materialize_entry(tier, source, entry) == path
    client.close()


def test_a_damaged_index_is_replaced_and_its_files_dropped(tmp_path, caplog):
    d, data = str(tmp_path / "t"), os.urandom(MiB)
    with FileTier(d, 64 * MiB) as tier:
        tier.materialize(fid("a"), len(data), blocks(data))
    with open(os.path.join(d, "index.db"), "r+b") as f:
        f.write(b"this is not an SQLite header")
    with FileTier(d, 64 * MiB) as tier:
        assert tier.path(fid("a")) is None and entries(d) == set()
        assert f"file tier {d}: damaged index {d}/index.db" in caplog.text
        assert file_sha(tier.materialize(fid("a"), len(data), blocks(data))) == sha(data)


def test_an_index_of_the_earlier_layout_gains_the_boot_mark_and_checks_its_files_once(tmp_path):
    d = str(tmp_path / "t")
    data = os.urandom(2 * MiB + 3)
    with FileTier(d, 64 * MiB) as tier:
        tier.materialize(fid("a"), len(data), blocks(data))
    db = sqlite3.connect(os.path.join(d, "index.db"))
    db.execute("ALTER TABLE files DROP COLUMN checked")  # as the index was before the mark
    db.commit()
    db.close()
    with FileTier(d, 64 * MiB) as tier:
        assert file_sha(tier.path(fid("a"))) == sha(data) and tier.dropped == 0  # checked, then handed out
    db = sqlite3.connect(os.path.join(d, "index.db"))
    try:
        assert db.execute("SELECT checked FROM files WHERE fid = ?", (fid("a"),)).fetchone() == (filetier.boot_mark(),)
    finally:
        db.close()
