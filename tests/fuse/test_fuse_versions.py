"""A file's version is part of its identity through the mount (cases C3, C4, C5).

Each test gets a dataset of its own (``fusever``) over a bucket of its own on the moto server, so
it may overwrite, delete and add objects. The runtime reads no blocks ahead
(``readAheadBlocks: 0``): which blocks are cached is then exactly what the test read, so a block
of an overwritten version is known to be missing from the cache.
"""

from __future__ import annotations

import errno
import functools
import itertools
import os
import re
import subprocess
import sys
import time
import types

import numpy as np
import pytest

from datacache_fuse.daemon import read_state
from fuse_support import (BLOCK, S3_KEY, S3_SECRET, apply_dataset, cli, force_cleanup, mount, sha256,
                          sha256_path, wait_until)

NAME = "fusever"
MIB = 1 << 20
_buckets = itertools.count()


class Versioned:
    """A dataset over a bucket the test owns: ``put``/``delete`` objects, ``mount``, ``sync``."""

    def __init__(self, moto, home: str, mountpoint: str):
        self.home, self.name, self.mountpoint = home, NAME, mountpoint
        self.bucket = f"fusever{os.getpid()}-{next(_buckets)}"
        self.fs = moto.s3fs(key=S3_KEY, secret=S3_SECRET)
        self.fs.mkdir(self.bucket)
        self.endpoint = moto.endpoint_url

    def put(self, rel: str, data: bytes) -> None:
        self.fs.pipe_file(f"{self.bucket}/data/{rel}", data)

    def delete(self, rel: str) -> None:
        self.fs.rm_file(f"{self.bucket}/data/{rel}")

    def mount(self, *args: str) -> str:
        """Apply the dataset and mount it (``args``: more ``datacache mount`` arguments)."""
        apply_dataset(self.home, NAME, self.endpoint, self.bucket, None, fuse={"readAheadBlocks": 0})
        mount(types.SimpleNamespace(home=self.home, name=NAME), self.mountpoint, *args)
        return self.mountpoint

    def sync(self) -> str:
        """``datacache sync`` in a process of its own, as a user runs it; returns its output."""
        r = subprocess.run([sys.executable, "-m", "datacache", "sync", NAME, "--home", self.home],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout


@pytest.fixture
def versioned(fuse_available, fuse_moto, tmp_path):
    home, mp = str(tmp_path / "home"), str(tmp_path / "mnt")
    os.makedirs(home, mode=0o700)
    os.makedirs(mp)
    env = Versioned(fuse_moto, home, mp)
    yield env
    force_cleanup(home, mp)


def _read_fd(fd: int, size: int) -> bytes:
    out, off = [], 0
    while True:
        chunk = os.pread(fd, MIB, off)
        if not chunk:
            break
        out.append(chunk)
        off += len(chunk)
    data = b"".join(out)
    assert len(data) == size
    return data


def test_old_handle_and_new_open_never_share_pages_after_a_per_file_refresh(versioned):
    rng = np.random.default_rng(11)
    v1, v2 = rng.bytes(3 * BLOCK + 5), rng.bytes(2 * BLOCK + 3)
    versioned.put("v.bin", v1)
    path = os.path.join(versioned.mount(), "v.bin")
    old = os.open(path, os.O_RDONLY)
    try:
        assert os.pread(old, 4096, 0) == v1[:4096]  # caches block 0 of v1, and only it
        versioned.put("v.bin", v2)
        probe = os.open(path, os.O_RDONLY)  # still v1 in the manifest
        try:
            with pytest.raises(OSError) as exc:
                os.pread(probe, 4096, 2 * BLOCK)  # v1's block 2 is not cached: the fill finds v2
            assert exc.value.errno == errno.ESTALE  # ... and refreshes the file's metadata
        finally:
            os.close(probe)
        new = os.open(path, os.O_RDONLY)
        try:
            # The old handle reads its head again (the new open must not have handed it the
            # pages of v2, nor may its pages reach the new handle).
            assert os.pread(old, MIB, 0) == v1[:MIB]
            assert os.fstat(new).st_size == len(v2)
            assert sha256(_read_fd(new, len(v2))) == sha256(v2)
            assert os.fstat(old).st_size == len(v1)
            with pytest.raises(OSError) as exc:  # v1's block 2 exists nowhere any more
                os.pread(old, 4096, 2 * BLOCK)
            assert exc.value.errno == errno.ESTALE
            assert os.pread(old, 4096, MIB) == v1[MIB:MIB + 4096]  # block 0 still reads as v1
        finally:
            os.close(new)
        assert os.stat(path).st_size == len(v2)
        assert sha256_path(path) == sha256(v2)
    finally:
        os.close(old)


def _gone(path: str) -> bool:
    try:
        os.stat(path)
    except FileNotFoundError:
        return True
    return False


@pytest.mark.parametrize("read_mode", ["no-open", "passthrough"])
def test_datacache_sync_reaches_a_running_mount_c3_c4_c5(versioned, read_mode):
    """In passthrough mode the files are complete in the cache after their first read, so their
    later opens are passed through, reopens answered by the compiled loop until the sync retires
    them (datacache_fuse.kernel.fast_open)."""
    rng = np.random.default_rng(12)
    keep, v1, v2, doomed, born = (rng.bytes(n) for n in (70_000, 200_000, 100_000, 5_000, 9_000))
    versioned.put("keep.bin", keep)
    versioned.put("dir/changed.bin", v1)
    versioned.put("dir/deleted.bin", doomed)
    mp = versioned.mount("--read-mode", read_mode)
    join = functools.partial(os.path.join, mp)
    for _ in range(3):  # passthrough: through READ, then passed through, then reopened in C
        for rel, data in (("keep.bin", keep), ("dir/changed.bin", v1), ("dir/deleted.bin", doomed)):
            time.sleep(0.05)  # the previous handle's RELEASE (an inode read through READ is not passed through)
            assert sha256_path(join(rel)) == sha256(data), rel
    for rel in ("dir/born.bin", "newdir/born.bin", "newdir"):  # negative entries, cached 60 s
        assert _gone(join(rel)), rel
    old = os.open(join("dir/changed.bin"), os.O_RDONLY)
    try:
        versioned.put("dir/changed.bin", v2)  # C5: shrunk from 200 KB to 100 KB
        versioned.delete("dir/deleted.bin")  # C4
        versioned.put("dir/born.bin", born)
        versioned.put("newdir/born.bin", born)
        # C3/C4 before a refresh: the old version, completely, from the cache
        assert sha256_path(join("dir/changed.bin")) == sha256(v1)
        assert sha256_path(join("dir/deleted.bin")) == sha256(doomed)
        assert "synced: 2 added, 1 changed, 1 deleted" in versioned.sync()
        wait_until(lambda: _gone(join("dir/deleted.bin")), 15, "the deleted file to leave the mount")
        wait_until(lambda: os.path.exists(join("newdir/born.bin")), 15, "the added file to appear")
        assert os.stat(join("dir/changed.bin")).st_size == len(v2)
        assert sha256_path(join("dir/changed.bin")) == sha256(v2)
        assert sha256_path(join("dir/born.bin")) == sha256(born)
        assert sha256_path(join("newdir/born.bin")) == sha256(born)
        assert sha256_path(join("keep.bin")) == sha256(keep)
        assert sorted(os.listdir(join("dir"))) == ["born.bin", "changed.bin"]
        assert sorted(os.listdir(mp)) == ["dir", "keep.bin", "newdir"]
        with pytest.raises(FileNotFoundError):
            open(join("dir/deleted.bin"), "rb")
        # the handle opened before the sync still reads v1 whole (all its blocks are cached)
        assert os.fstat(old).st_size == len(v1)
        assert sha256(_read_fd(old, len(v1))) == sha256(v1)
    finally:
        os.close(old)
    if read_mode == "passthrough":  # the daemon's last words count the reopens answered in C
        log = read_state(versioned.home, mp)["log"]
        assert cli("unmount", mp, home=versioned.home).returncode == 0
        wait_until(lambda: "answered by the compiled loop" in open(log, encoding="utf-8").read(), 30, "its counts")
        with open(log, encoding="utf-8") as f:
            in_c = int(re.findall(r"answered by the compiled loop: (\d+)", f.read())[-1])
        assert in_c >= 3, in_c


def test_long_lived_fsspec_filesystem_picks_up_a_sync(versioned):
    from datacache.fs import DatacacheFileSystem

    rng = np.random.default_rng(13)
    v1, v2 = rng.bytes(30_000), rng.bytes(12_345)
    versioned.put("a.bin", v1)
    versioned.put("b.bin", v1)
    apply_dataset(versioned.home, NAME, versioned.endpoint, versioned.bucket, None)
    fs = DatacacheFileSystem(home=versioned.home, skip_instance_cache=True)
    try:
        assert fs.cat_file(f"{NAME}/a.bin") == v1
        versioned.put("a.bin", v2)
        versioned.delete("b.bin")
        versioned.put("c.bin", v2)
        assert fs.cat_file(f"{NAME}/a.bin") == v1  # cached, and no refresh yet (C3)
        versioned.sync()
        wait_until(lambda: not fs.exists(f"{NAME}/b.bin"), 10, "the deleted file to disappear")
        assert fs.info(f"{NAME}/a.bin")["size"] == len(v2)
        assert fs.cat_file(f"{NAME}/a.bin") == v2
        assert fs.cat_file(f"{NAME}/c.bin") == v2
        assert sorted(fs.ls(NAME, detail=False)) == [f"{NAME}/a.bin", f"{NAME}/c.bin"]
    finally:
        fs.close()


def test_inodes_forgotten_by_the_kernel_come_back_with_the_same_numbers(versioned):
    rng = np.random.default_rng(14)
    files = {f"d{i % 3}/f{i}.bin": rng.bytes(1000 + i) for i in range(30)}
    for rel, data in files.items():
        versioned.put(rel, data)
    mp = versioned.mount()
    before = {rel: os.stat(os.path.join(mp, rel)).st_ino for rel in files}
    assert len(set(before.values())) == len(files)
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2")  # dentries and inodes: the kernel sends FORGET for what it held
    after = {}
    for root, _, names in os.walk(mp):
        for name in names:
            full = os.path.join(root, name)
            rel = os.path.relpath(full, mp)
            after[rel] = os.stat(full).st_ino
            assert sha256_path(full) == sha256(files[rel]), rel
    assert after == before  # numbers derive from (path, version), not from the order of lookups
