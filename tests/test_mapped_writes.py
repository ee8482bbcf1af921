"""A long buffered block write goes through a shared mapping of its range (``fallocate``, then a
copy by the kernel, ``process_vm_writev``, without the GIL): threads filling blocks of one cache
file no longer queue on its inode lock. The bytes, the page cache residency and the holes are the
same as a ``pwrite``'s; a full device is an ``ENOSPC`` error and a file truncated under the copy
a fallback to ``pwrite``, never a SIGBUS; a file system without ``fallocate`` (ramfs) takes the
bytes by ``pwrite``."""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import sys
import threading

import pytest

from datacache.cache import extents
from datacache.cache.extents import MAPPED_MIN, write_range
from test_bulk_writes import resident

MiB = 1 << 20


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_long_write_is_mapped_and_lands_after_a_hole(tmp_path):
    path = str(tmp_path / "f")
    data = os.urandom(3 * MiB + 1000)
    assert extents._write_mapped(path, 4 * MiB, memoryview(data), 0o600) is True  # taken, not refused
    st = os.stat(path)
    assert st.st_mode & 0o777 == 0o600 and st.st_size == 4 * MiB + len(data)
    assert st.st_blocks * 512 < 4 * MiB  # the range before it holds no space
    assert resident(path) >= 3 * MiB  # written through the page cache, as a pwrite is
    with open(path, "rb") as f:
        assert f.read(4 * MiB) == bytes(4 * MiB)
        assert _sha(f.read()) == _sha(data)


def test_sixteen_threads_fill_one_file_and_every_block_holds_its_bytes(tmp_path):
    path = str(tmp_path / "f")
    blocks = [os.urandom(4 * MiB) for _ in range(15)] + [os.urandom(MAPPED_MIN + 777)]
    failures = []

    def put(i: int) -> None:
        try:
            write_range(path, i * 4 * MiB, memoryview(blocks[i]), 0o600)
        except Exception as err:  # noqa: BLE001 - reported below
            failures.append(err)

    threads = [threading.Thread(target=put, args=(i,)) for i in reversed(range(len(blocks)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert os.path.getsize(path) == 15 * 4 * MiB + len(blocks[-1])  # a later, lower block never shrank it
    with open(path, "rb") as f:
        for i, block in enumerate(blocks):
            f.seek(i * 4 * MiB)
            assert _sha(f.read(len(block))) == _sha(block), f"block {i}"


def test_a_short_write_and_an_unaligned_offset_take_pwrite(tmp_path, monkeypatch):
    mapped = []
    real = extents._write_mapped
    monkeypatch.setattr(extents, "_write_mapped", lambda *a: mapped.append(a[1]) or real(*a))
    short, odd = os.urandom(MAPPED_MIN - 1), os.urandom(2 * MiB)
    write_range(str(tmp_path / "short"), 0, short, 0o600)
    write_range(str(tmp_path / "odd"), 100, odd, 0o600)
    write_range(str(tmp_path / "long"), 8192, odd, 0o600)
    assert mapped == [8192]
    assert (tmp_path / "short").read_bytes() == short
    assert (tmp_path / "odd").read_bytes()[100:] == odd
    assert (tmp_path / "long").read_bytes()[8192:] == odd


def test_a_file_system_without_fallocate_takes_the_bytes_by_pwrite(ramfs):
    path = str(ramfs / "f")
    data = os.urandom(2 * MiB + 5)
    assert extents._write_mapped(path, 0, memoryview(data), 0o600) is False  # EOPNOTSUPP: not mapped
    assert write_range(path, 4 * MiB, data, 0o600)
    with open(path, "rb") as f:
        f.seek(4 * MiB)
        assert _sha(f.read()) == _sha(data)


def test_a_full_device_is_enospc_not_a_sigbus(small_tmpfs):
    path = str(small_tmpfs / "f")
    first = os.urandom(4 * MiB)
    write_range(path, 0, first, 0o600)
    with pytest.raises(OSError) as caught:
        write_range(path, 4 * MiB, os.urandom(4 * MiB), 0o600)  # 2 MiB left
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == path
    with open(path, "rb") as f:
        assert _sha(f.read(4 * MiB)) == _sha(first)  # what was stored is intact


_TRUNCATED_UNDER_THE_MAPPING = """
import ctypes, mmap, os, sys
from datacache.cache import extents
path = sys.argv[1]
with open(path, "wb") as f:
    f.truncate(2 << 20)
fd = os.open(path, os.O_RDWR)
mapped = mmap.mmap(fd, 2 << 20)
os.truncate(path, 0)  # behind the mapping's back: a store by the CPU there is a SIGBUS
anchor = ctypes.c_char.from_buffer(mapped)
print(extents._copy_into(ctypes.addressof(anchor), memoryview(os.urandom(2 << 20))))
"""


def test_a_copy_into_a_truncated_mapping_fails_without_a_sigbus(tmp_path):
    child = subprocess.run([sys.executable, "-c", _TRUNCATED_UNDER_THE_MAPPING, str(tmp_path / "f")],
                           capture_output=True, text=True, timeout=60, check=False)
    assert (child.returncode, child.stdout) == (0, "False\n"), child.stderr  # -7 was SIGBUS


def test_a_file_truncated_under_a_mapped_write_still_gets_its_bytes_by_pwrite(tmp_path, monkeypatch):
    path = str(tmp_path / "f")
    data = os.urandom(4 * MiB)
    real = extents._copy_into
    copies = []

    def truncate_then_copy(address, view):
        os.truncate(path, 0)  # e.g. a cache file cleared by hand, a process that rebuilt it
        copies.append(real(address, view))
        return copies[-1]

    monkeypatch.setattr(extents, "_copy_into", truncate_then_copy)
    assert write_range(path, 4 * MiB, data, 0o600)
    assert copies == [False]
    assert os.path.getsize(path) == 8 * MiB
    with open(path, "rb") as f:
        f.seek(4 * MiB)
        assert _sha(f.read()) == _sha(data)


def test_whole_huge_folios_are_advised_and_the_holes_between_blocks_stay_holes(tmp_path, monkeypatch):
    """The whole PMD-sized folios of a block are mapped with ``MADV_HUGEPAGE`` (their page cache
    then reads as fast as a ``write``'s), a file's last block up to its last whole folio; a block
    left out between them and the tails keep their space as written: no hole is allocated by a
    huge folio's write fault."""
    import mmap

    huge = extents.huge_folio_bytes()
    if not huge:
        pytest.skip("the kernel has no transparent huge pages (no hpage_pmd_size)")
    advised = []

    class Recording(mmap.mmap):
        def madvise(self, option, *args):
            advised.append((len(self), option, *args))
            return super().madvise(option, *args)

    monkeypatch.setattr(extents.mmap, "mmap", Recording)
    path, bs = str(tmp_path / "f"), 2 * huge
    tail = huge + huge // 2 + 4096  # one whole folio and a piece
    blocks = {0: os.urandom(bs), 2: os.urandom(bs), 3: os.urandom(tail)}  # block 1: a hole
    for index in (3, 0, 2):  # the last block first, as a reader at the end would fill it
        assert write_range(path, index * bs, blocks[index], 0o600) is True
    assert advised == [(tail, mmap.MADV_HUGEPAGE, 0, huge)] + [(bs, mmap.MADV_HUGEPAGE, 0, bs)] * 2
    advised.clear()
    assert write_range(str(tmp_path / "g"), 0, os.urandom(huge - 4096), 0o600) is True
    assert advised == []  # shorter than a folio: no advice
    assert write_range(str(tmp_path / "h"), huge // 2, os.urandom(2 * huge), 0o600) is True
    assert advised == [(2 * huge, mmap.MADV_HUGEPAGE, huge // 2, huge)]  # the one whole folio inside
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        for index, data in blocks.items():
            assert _sha(os.pread(fd, len(data), index * bs)) == _sha(data), index
        assert os.pread(fd, bs, bs) == bytes(bs)
    finally:
        os.close(fd)
    written = sum(len(d) for d in blocks.values())
    assert written <= os.stat(path).st_blocks * 512 <= written + 64 * 1024  # + the extent tree at most
