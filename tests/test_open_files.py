"""Small cache files kept open between block reads (``datacache.cache.openfiles``): a second read
of a small file is one ``pread`` with no ``open``; a file evicted by this process or by another
(a real second process) is never read through a kept descriptor, and its space is not held: the
descriptor is closed at the next use, the tier's own unlink or the sweep; a hole punched under a
kept descriptor reads as zeros, which fail the checksum (a miss, then the right bytes again)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from datacache.cache import openfiles
from datacache.cache.disk import DiskTier
from datacache.cache.openfiles import OpenFiles

BLOCK = 256 << 10


def _open_fds() -> set[str]:
    """Paths this process has open (``/proc/self/fd``)."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return out


def _evict_in_another_process(directory: str, key: str) -> None:
    code = ("import sys; from datacache.cache.disk import DiskTier\n"
            f"t = DiskTier({directory!r}, {64 * BLOCK}, block_size={BLOCK}); t.discard({key!r}); t.close()")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_kept_descriptor_serves_later_reads_and_least_recent_files_are_closed(tmp_path):
    paths = []
    for i in range(3):
        p = tmp_path / f"f{i}"
        p.write_bytes(bytes([i]) * 1000)
        paths.append(str(p))
    files = OpenFiles(limit=2)
    with files.using(paths[0]) as fd0:
        assert os.pread(fd0, 3, 0) == b"\0\0\0"
    with files.using(paths[0]) as again:
        assert again == fd0  # kept: no second open
    for p in paths[1:]:
        with files.using(p):
            pass
    assert len(files) == 2 and paths[0] not in _open_fds()  # the least recently used was closed
    assert {paths[1], paths[2]} <= _open_fds()
    files.close()
    assert not {paths[1], paths[2]} & _open_fds()


def test_an_unlinked_file_is_not_read_and_its_descriptor_goes(tmp_path):
    path = str(tmp_path / "f")
    with open(path, "wb") as f:
        f.write(b"x" * 100)
    files = OpenFiles()
    with files.using(path):
        pass
    os.unlink(path)
    try:
        with files.using(path):
            raise AssertionError("an unlinked file was handed out")
    except FileNotFoundError as err:
        assert err.filename == path
    assert len(files) == 0 and not any(p.startswith(path) for p in _open_fds())


def test_a_descriptor_in_use_is_closed_only_after_its_reader(tmp_path):
    path = str(tmp_path / "f")
    with open(path, "wb") as f:
        f.write(b"abc")
    files = OpenFiles()
    with files.using(path):
        pass
    with files.using(path) as fd:
        files.forget(path)  # the tier unlinks it meanwhile
        assert os.pread(fd, 3, 0) == b"abc"  # still this reader's
    assert path not in _open_fds()


def test_the_sweep_closes_files_another_process_unlinked_or_grew_while_nothing_is_read(tmp_path, monkeypatch):
    """An idle reader (a FUSE daemon serving through passthrough) held 25-41 MiB of files other
    processes had evicted, or had filled past the size bound after it kept them, for 12 minutes:
    only its next keep swept. The sweep thread lets them go within ``SWEEP_S``."""
    monkeypatch.setattr(openfiles, "SWEEP_S", 0.05)
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for p in (a, b):
        with open(p, "wb") as f:
            f.write(b"1")
    files = OpenFiles(max_file=1 << 20)
    try:
        for p in (a, b):
            with files.using(p):
                pass
        assert len(files) == 2
        os.unlink(a)  # evicted elsewhere; this process never reads it again
        with open(b, "ab") as f:  # more of its blocks stored elsewhere: past max_file now
            f.write(os.urandom(2 << 20))
        deadline = time.monotonic() + 5
        while len(files) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(files) == 0 and not any(p.startswith((a, b)) for p in _open_fds())
    finally:
        files.close()


def test_a_kept_file_grown_past_the_bound_is_let_go_after_its_next_use(tmp_path):
    path = str(tmp_path / "f")
    with open(path, "wb") as f:
        f.write(b"x" * 100)
    files = OpenFiles(max_file=1 << 20)
    try:
        with files.using(path):
            pass
        with open(path, "ab") as f:
            f.write(os.urandom(2 << 20))
        with files.using(path) as fd:
            assert os.pread(fd, 3, 0) == b"xxx"  # this read still gets it
        assert len(files) == 0 and path not in _open_fds()
    finally:
        files.close()


def test_large_files_are_not_kept(tmp_path):
    path = str(tmp_path / "big")
    with open(path, "wb") as f:
        f.write(os.urandom(3 << 20))
    files = OpenFiles(max_file=1 << 20)
    with files.using(path):
        pass
    assert len(files) == 0 and path not in _open_fds()


def test_disk_tier_reads_after_another_process_evicts_or_punches(tmp_path):
    directory = str(tmp_path / "ssd")
    tier = DiskTier(directory, 64 * BLOCK, block_size=BLOCK)
    small, two = os.urandom(1000), [os.urandom(BLOCK), os.urandom(500)]
    try:
        assert tier.put("ds/small/0", small)
        assert tier.put("ds/two/1", two[1]) and tier.put("ds/two/0", two[0])
        for _ in range(2):
            assert tier.get("ds/small/0") == small and tier.get("ds/two/0") == two[0]
        small_file, two_file = tier.block_file("ds/small/0"), tier.block_file("ds/two/0")
        assert {small_file, two_file} <= _open_fds()  # kept between reads
        _evict_in_another_process(directory, "ds/small/0")  # its only block: the file is unlinked
        _evict_in_another_process(directory, "ds/two/0")  # one of two: a hole is punched
        assert tier.get("ds/small/0") is None  # a miss, never the unlinked file's bytes
        assert tier.get("ds/two/0") is None  # zeros failed the checksum: a miss, not damage
        assert tier.corrupt == 0
        assert not any(p.startswith(small_file) for p in _open_fds())  # its space is free
        assert tier.get("ds/two/1") == two[1]  # the other block is still served
        assert tier.put("ds/small/0", small) and tier.get("ds/small/0") == small  # stored anew, new file
        assert tier.block_file("ds/small/0") != small_file
    finally:
        tier.close()
    assert not any(p.startswith(tier.files) for p in _open_fds())


def test_the_tiers_own_eviction_frees_the_space_at_once(tmp_path):
    tier = DiskTier(str(tmp_path / "ssd"), 64 * BLOCK, block_size=BLOCK)
    try:
        assert tier.put("ds/a/0", b"a" * 1000)
        assert tier.get("ds/a/0") == b"a" * 1000
        path = tier.block_file("ds/a/0")
        assert path in _open_fds()
        tier.discard("ds/a/0")
        assert not any(p.startswith(path) for p in _open_fds())
    finally:
        tier.close()
