"""Passthrough over the disk tier's cache files (issue 17 item 4), through a real mount in
``--read-mode passthrough``:

- a file evicted while a passthrough handle has it open: that reader goes on reading the complete
  old bytes (the cache file is unlinked, never punched or truncated under it), and a new open
  reads the right bytes (through READ, refetched);
- a cache file damaged while no daemon ran is checked when the next daemon first passes it
  through: the open is served through READ, the damaged block refetched, never the bad byte.

A passthrough handle's reads reach no daemon: the daemon's ``syscr`` (one per request it reads
from /dev/fuse) does not move while one is read."""

from __future__ import annotations

import hashlib
import itertools
import os
import sqlite3
import subprocess
import sys
import time

import numpy as np
import pytest

from datacache.cache.boot import boot_mark
from datacache.control.embedded import Embedded
from fuse_support import BLOCK, apply_dataset, cli, daemon_pid, force_cleanup, mount, sha256, wait_until

FILE_SIZE = 3 * BLOCK + 12345  # four blocks, the last one short
OTHERS = 3
TARGET = "local/target.bin"
_DATASETS = itertools.count()


def _read_syscalls(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        return int(dict(line.split(": ") for line in f.read().splitlines())["syscr"])


@pytest.fixture
def small_cache(fuse_env, fuse_moto, tmp_path):
    """A dataset of its own (``evict<n>``, returned with the bytes of ``TARGET``): a local
    directory of ``target.bin`` and ``OTHERS`` files of the same size, on a disk level with room
    for three of them (quota 40 MiB: high watermark 38 MiB), and a small S3 mount."""
    rng = np.random.default_rng(17)
    local = tmp_path / "src"
    local.mkdir()
    files = {}
    for name in ["target.bin"] + [f"other{i}.bin" for i in range(OTHERS)]:
        files[f"local/{name}"] = rng.bytes(FILE_SIZE)
        (local / name).write_bytes(files[f"local/{name}"])
    s3 = fuse_moto.s3fs(key="k", secret="s")
    if not s3.exists("fuseevict/data/x.txt"):
        s3.mkdir("fuseevict")
        s3.pipe("fuseevict/data/x.txt", b"x")
    name = f"evict{next(_DATASETS)}"
    apply_dataset(fuse_env.home, name, fuse_moto.endpoint_url, "fuseevict", str(local), quota="40Mi")
    return name, files[TARGET]


def _cache_file(home: str, name: str, path: str) -> str | None:
    """The disk tier's cache file of ``path``'s current version in dataset ``name``, from the
    tier's index (None when its block 0 is not stored)."""
    client = Embedded(home).open_dataset(name)
    try:
        key = str(client.source.key(client.stat(path), 0))
        (disk,) = client.source.store.levels
        extent = disk.block_extent(key)
        return extent[0] if extent else None
    finally:
        client.close()


def _mount_and_fill(fuse_env, name: str, mountpoint: str, want: str) -> tuple[int, str]:
    """Mount dataset ``name`` in passthrough mode and read ``target.bin`` once (through READ: its
    blocks are stored in one cache file); returns the daemon's pid and that cache file."""
    mount(fuse_env, mountpoint, "--read-mode", "passthrough", name=name)
    daemon = wait_until(lambda: daemon_pid(fuse_env.home, mountpoint), 10, "the daemon's state file")
    with open(os.path.join(mountpoint, TARGET), "rb") as f:
        assert sha256(f.read()) == want
    return daemon, wait_until(lambda: _cache_file(fuse_env.home, name, TARGET), 30, "target.bin's cache file")


def _warmup(home: str, name: str, *paths: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "datacache", "warmup", "-q", "--home", home, name, *paths],
                          capture_output=True, text=True, timeout=120)


def _costs_no_request(daemon: int, read, fd: int):
    """Run ``read()`` on ``fd`` (a file of the mount) with the FUSE inode's page cache dropped
    first, and return its result when the daemon read no request meanwhile (else None). Other
    threads of the daemon read a file now and then: two reads are noise, a block through READ
    costs at least four requests and as many reads of the cache."""
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # a handle read through READ would get no page
    before = _read_syscalls(daemon)
    result = read()
    return result if _read_syscalls(daemon) - before <= 2 else None


def _passthrough_open(mountpoint: str, rel: str, daemon: int) -> int:
    """An fd of ``rel`` opened so that the kernel reads its cache file directly: retried until
    reading a block costs the daemon no request (the kernel passes an inode through only while no
    handle reading through the page cache is open, so the last RELEASE must have arrived, and
    the version must be complete in the cache)."""
    def attempt():
        fd = os.open(os.path.join(mountpoint, rel), os.O_RDONLY)
        if _costs_no_request(daemon, lambda: os.pread(fd, BLOCK, BLOCK), fd):
            return fd
        os.close(fd)
        time.sleep(0.2)
        return None
    return wait_until(attempt, 30, f"a passthrough open of {rel}")


def test_eviction_under_an_open_passthrough_handle_never_changes_its_bytes(fuse_env, small_cache, mountpoint):
    name, source = small_cache
    want = sha256(source)
    try:
        daemon, cached = _mount_and_fill(fuse_env, name, mountpoint, want)
        fd = _passthrough_open(mountpoint, TARGET, daemon)
        try:
            first = _costs_no_request(daemon, lambda: os.pread(fd, FILE_SIZE // 2, 0), fd)
            assert first is not None  # passed through: the daemon saw no READ

            # The other files fill the quota: the least recently used version, target.bin's,
            # handed out whole, is evicted whole.
            warmup = _warmup(fuse_env.home, name, *[f"local/other{i}.bin" for i in range(OTHERS)])
            assert not os.path.exists(cached), warmup.stdout + warmup.stderr
            assert _cache_file(fuse_env.home, name, TARGET) is None  # its rows went with it

            rest = _costs_no_request(daemon, lambda: os.pread(fd, FILE_SIZE, len(first)), fd)
            assert rest is not None  # still the unlinked cache file, not the daemon (which would refetch)
            assert hashlib.sha256(first + rest).hexdigest() == want  # no zeros, no mixed bytes
        finally:
            os.close(fd)
        with open(os.path.join(mountpoint, TARGET), "rb") as f:  # a new open after the eviction
            assert sha256(f.read()) == want
    finally:
        force_cleanup(fuse_env.home, mountpoint)


def test_a_damaged_cache_file_is_checked_before_it_is_first_passed_through_after_a_reboot(fuse_env, small_cache,
                                                                                          mountpoint):
    name, source = small_cache
    want = sha256(source)
    try:
        daemon, cached = _mount_and_fill(fuse_env, name, mountpoint, want)
        os.close(_passthrough_open(mountpoint, TARGET, daemon))  # handed out whole, checked in this boot
        assert cli("unmount", mountpoint, home=fuse_env.home).returncode == 0
        wait_until(lambda: not os.path.exists(f"/proc/{daemon}"), 30, "the daemon to exit")

        with open(cached, "r+b") as f:  # the device changed one byte of block 2 while no daemon ran
            f.seek(2 * BLOCK + 99)
            f.write(bytes([source[2 * BLOCK + 99] ^ 0xFF]))
        # ... and the machine rebooted: the index's marks name an earlier boot (a test cannot reboot;
        # a daemon of the same boot trusts the first daemon's check).
        index = sqlite3.connect(os.path.join(os.path.dirname(os.path.dirname(cached)), "index.db"))
        try:
            with index:
                assert index.execute("UPDATE files SET exposed = ? WHERE exposed = ?",
                                     (boot_mark() ^ 4, boot_mark())).rowcount == 1
        finally:
            index.close()
        mount(fuse_env, mountpoint, "--read-mode", "passthrough", name=name)
        daemon = wait_until(lambda: daemon_pid(fuse_env.home, mountpoint), 10, "the new daemon's state file")
        before = _read_syscalls(daemon)
        with open(os.path.join(mountpoint, TARGET), "rb", buffering=0) as f:
            assert sha256(f.read()) == want  # the new daemon's check refused the file: served by READ
        assert _read_syscalls(daemon) - before > 4  # OPEN, the READs, RELEASE: not passed through
        assert not os.path.exists(cached)  # handed out before: the whole file went with the bad block
        # Refetched and stored anew as a new cache file, which a later open passes through.
        wait_until(lambda: _cache_file(fuse_env.home, name, TARGET), 30, "target.bin's new cache file")
        fd = _passthrough_open(mountpoint, TARGET, daemon)
        try:
            assert hashlib.sha256(os.pread(fd, FILE_SIZE + 1, 0)).hexdigest() == want
        finally:
            os.close(fd)
    finally:
        force_cleanup(fuse_env.home, mountpoint)
