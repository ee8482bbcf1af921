"""A disk tier on btrfs whose device fills before the quota: 16 threads put blocks until it is
full, and the process lives (SQLite's WAL index ``index.db-shm`` is a shared mapping; before the
tier's directory was made NOCOW, a store into a page of it on the full copy-on-write device was a
SIGBUS that killed the process, 2 runs of 2), and every block kept reads back right.

Needs root, ``mkfs.btrfs`` (Debian's btrfs-progs, which ``make system`` installs) and a loop
device."""

from __future__ import annotations

import array
import fcntl
import os
import subprocess
import sys

import pytest

from datacache.cache.disk import DiskTier
from datacache.cache.extents import FS_IOC_GETFLAGS, FS_NOCOW_FL, commit_frees
from support import loop_mounted

_FILL = """
import hashlib, os, sys, threading, time
from datacache.cache.disk import FREE_SPACE_RATIO, DiskTier
tier = DiskTier(sys.argv[1], 1 << 30, free_space_ratio=FREE_SPACE_RATIO)  # quota 1 GiB on a 200 MiB device
blocks = [os.urandom(4 << 20) for _ in range(8)]
digests = {hashlib.sha256(b).digest() for b in blocks}
def worker(t):
    end, i = time.time() + 5, 0
    while time.time() < end:
        n = (t * 7 + i) % 48
        i += 1
        tier.put(f"ds/f{n // 6}/{n % 6}", blocks[n % 8])
threads = [threading.Thread(target=worker, args=(t,)) for t in range(16)]
for t in threads: t.start()
for t in threads: t.join()
kept = [k for k in tier.keys() if tier.get(k) is not None]
wrong = sum(hashlib.sha256(bytes(tier.get(k))).digest() not in digests for k in kept)
print(len(kept), wrong, tier.full_bypasses, tier.commits, tier.healthy)
"""


@pytest.fixture
def btrfs(tmp_path):
    """A fresh 200 MiB btrfs on a loop device (root only)."""
    yield from loop_mounted(tmp_path, ["mkfs.btrfs", "-q", "-f"], 200 << 20, "btrfs")


def _nocow(path) -> bool:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        flags = array.array("i", [0])
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, flags, True)
        return bool(flags[0] & FS_NOCOW_FL)
    finally:
        os.close(fd)


def test_sixteen_threads_filling_a_btrfs_device_keep_the_process_alive_and_the_blocks_right(btrfs):
    tier = btrfs / "ssd"
    child = subprocess.run([sys.executable, "-c", _FILL, str(tier)], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr[-2000:]  # -7 was SIGBUS
    kept, wrong, full_bypasses, commits, healthy = child.stdout.split()
    # ~180 MiB hold ~40 blocks; 18-26 stay here. btrfs shows freed space only once its
    # transaction commits: before the tier asked for the commit, 0-1 stayed in 3 runs of 7
    assert int(kept) >= 14 and int(wrong) == 0 and int(full_bypasses) > 0 and healthy == "True"
    assert int(commits) > 0  # evictions for room asked btrfs to commit, so their frees showed
    # The index is made in place; the cache files stay copy-on-write (btrfs frees a punched
    # range only with its whole extent, and NOCOW extents stayed whole).
    assert _nocow(tier) and not _nocow(tier / "files")


def test_a_tier_nested_in_another_tiers_directory_keeps_its_cache_files_copy_on_write(btrfs):
    """A worker's tier made inside a level directory another tier marked NOCOW inherits the
    attribute: its index stays in place, its cache files must not (punched ranges would not be
    freed)."""
    level = DiskTier(str(btrfs / "level"), 64 << 20)
    nested = DiskTier(str(btrfs / "level" / "worker-0"), 64 << 20)
    try:
        assert _nocow(btrfs / "level") and _nocow(btrfs / "level" / "worker-0")
        assert not _nocow(btrfs / "level" / "files") and not _nocow(btrfs / "level" / "worker-0" / "files")
    finally:
        nested.close()
        level.close()


def _free(path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_commit_frees_makes_unlinked_space_show_on_btrfs_and_is_refused_elsewhere(btrfs, tmp_path):
    """btrfs shows the space of unlinked files only once their transaction commits (``statvfs``
    unchanged before); ``commit_frees`` commits it. A file system without the call says False."""
    for i in range(8):
        with open(btrfs / f"f{i}", "wb") as f:
            f.write(os.urandom(8 << 20))
    os.sync()
    full = _free(btrfs)
    for i in range(8):
        os.unlink(btrfs / f"f{i}")
    assert _free(btrfs) - full < 16 << 20  # 64 MiB unlinked, not shown yet
    assert commit_frees(str(btrfs))
    assert _free(btrfs) - full >= 56 << 20
    assert commit_frees(str(tmp_path)) is False  # ext4 or tmpfs: no such ioctl
