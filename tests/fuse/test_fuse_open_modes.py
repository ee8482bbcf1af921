"""The two ways a file is opened: the kernel's no-open mode (the default) and a file handle per
open (``--read-mode passthrough``), which passes file-tier files through to the kernel.

Each FUSE request the daemon serves is one read of /dev/fuse, so the daemon's ``syscr`` in
/proc/PID/io counts requests: re-opening page-cached files must cost nothing in no-open mode and
an OPEN plus a RELEASE per file with handles. (Python's buffered ``open()`` also calls isatty(),
an IOCTL request the kernel sends to every FUSE file system; unbuffered opens do not make it.)"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import re
import time

import pytest

from datacache_fuse.daemon import read_state
from datacache_fuse.kernel.ring_queue import possible_cpus
from datacache_fuse.kernel.session import RING_THREADS
from fuse_support import (BIG_SIZE, cli, daemon_pid, force_cleanup, mount, sha256, sha256_path, uring_enabled,
                          wait_until)


def _read_syscalls(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        return int(dict(line.split(": ") for line in f.read().splitlines())["syscr"])


def _log(home: str, mountpoint: str) -> str:
    with open(read_state(home, mountpoint)["log"], encoding="utf-8") as f:
        return f.read()


@pytest.mark.parametrize("transport", ["dev", "io_uring"])
def test_more_requests_at_once_than_the_daemon_has_workers_all_answered(fuse_env, fuse_moto, mountpoint, transport):
    """96 threads read 96 cold files at once (each READ waits on a GET from moto); the daemon
    serves with 16 worker threads (``-o io_uring``: 4 per CPU's ring queue), so most requests
    wait in the kernel's queue until one is free. Every byte comes back right, with buffered opens
    (an IOCTL each) mixed in, and the daemon still serves."""
    import threading

    import numpy as np

    from fuse_support import S3_KEY, S3_SECRET, apply_dataset

    rng = np.random.default_rng(13)
    objects = {f"g{i:03d}.bin": rng.bytes(int(rng.integers(200_000, 600_000))) for i in range(96)}
    fs = fuse_moto.s3fs(key=S3_KEY, secret=S3_SECRET)
    bucket = "fuseburst" if transport == "dev" else "fuseburst-uring"  # one moto serves both
    fs.mkdir(bucket)
    fs.pipe({f"{bucket}/data/{k}": v for k, v in objects.items()})
    apply_dataset(fuse_env.home, "burst", fuse_moto.endpoint_url, bucket, None)
    start = threading.Barrier(len(objects))
    got: dict[str, str] = {}

    def read(rel: str, buffered: bool) -> None:
        start.wait()
        with open(os.path.join(mountpoint, rel), "rb", buffering=-1 if buffered else 0) as f:
            got[rel] = sha256(f.read())

    pid = None
    try:
        with uring_enabled(transport == "io_uring"):
            pid = mount(fuse_env, mountpoint, *(("-o", "io_uring") if transport == "io_uring" else ()), name="burst")
        threads = RING_THREADS * len(possible_cpus())
        # the mount answers once its last ring queue registers, maybe before the daemon logs it
        wait_until(lambda: "mounted " in _log(fuse_env.home, mountpoint), 10, "the daemon's 'mounted' line")
        assert (f"FUSE over io_uring: {threads} threads" in _log(fuse_env.home, mountpoint)) == (transport == "io_uring")
        threads = [threading.Thread(target=read, args=(rel, i % 2 == 0)) for i, rel in enumerate(objects)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert {rel: sha256(data) for rel, data in objects.items()} == got
        assert os.listdir(mountpoint)  # the daemon still serves
    finally:
        force_cleanup(fuse_env.home, mountpoint, pid)


@pytest.mark.parametrize("mode, extra", [("no-open", ("--read-mode", "no-open")), ("handles", ("--read-mode", "passthrough"))])
def test_warm_reopens_cost_the_daemon_no_request_only_in_no_open_mode(fuse_env, mountpoint, mode, extra):
    files = sorted(p for p in fuse_env.shared_files if p.startswith("s3/small/"))
    assert len(files) >= 10
    pid = None
    try:
        pid = mount(fuse_env, mountpoint, *extra)
        daemon = wait_until(lambda: daemon_pid(fuse_env.home, mountpoint), 10, "the daemon's state file")
        said = "no-open mode" if mode == "no-open" else "a file handle per open"
        assert f", {said}," in _log(fuse_env.home, mountpoint)  # the mode the daemon says it serves in
        for rel in files:  # epoch 1: lookups, reads, page cache filled
            assert sha256_path(os.path.join(mountpoint, rel)) == fuse_env.expected[rel], rel
        rounds = 20
        before = _read_syscalls(daemon)
        for _ in range(rounds):  # later epochs: page-cached files opened again
            for rel in files:
                with open(os.path.join(mountpoint, rel), "rb", buffering=0) as f:  # no isatty ioctl
                    assert sha256(f.read()) == fuse_env.expected[rel], rel
        opens = rounds * len(files)
        if mode == "no-open":
            requests = _read_syscalls(daemon) - before
            assert requests < opens // 10, f"{requests} requests for {opens} page-cached opens"
        else:  # the kernel sends a RELEASE in the background after close(): the last may come later
            wait_until(lambda: _read_syscalls(daemon) - before >= 2 * opens, 5,
                       f"an OPEN and a RELEASE for each of {opens} opens")
    finally:
        force_cleanup(fuse_env.home, mountpoint, pid)


def test_no_open_mode_reads_many_files_at_once_past_the_kept_readers(fuse_env, fuse_moto, mountpoint):
    """More files read interleaved than the daemon keeps per-inode Readers for (INODE_READERS):
    every byte still right, page cache dropped first so every read reaches the daemon."""
    import numpy as np

    from datacache_fuse.handles import INODE_READERS
    from fuse_support import S3_KEY, S3_SECRET, apply_dataset

    rng = np.random.default_rng(11)
    objects = {f"f{i:03d}.bin": rng.bytes(int(rng.integers(1, 300_000))) for i in range(INODE_READERS + 36)}
    fs = fuse_moto.s3fs(key=S3_KEY, secret=S3_SECRET)
    fs.mkdir("fusemany")
    fs.pipe({f"fusemany/data/{k}": v for k, v in objects.items()})
    apply_dataset(fuse_env.home, "many", fuse_moto.endpoint_url, "fusemany", None)
    fds = {}
    pid = None
    try:
        pid = mount(fuse_env, mountpoint, name="many")
        for rel in objects:
            fd = os.open(os.path.join(mountpoint, rel), os.O_RDONLY)  # a single mount sits at the root
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            fds[rel] = fd
        got = {rel: bytearray() for rel in objects}
        chunk = 64 * 1024
        pending = list(objects)
        while pending:  # round robin: one chunk of every unfinished file per round
            for rel in list(pending):
                data = os.pread(fds[rel], chunk, len(got[rel]))
                got[rel] += data
                if not data:
                    pending.remove(rel)
        for rel, data in objects.items():
            assert sha256(bytes(got[rel])) == sha256(data), rel
    finally:
        for fd in fds.values():
            os.close(fd)
        force_cleanup(fuse_env.home, mountpoint, pid)


def test_open_handles_pass_complete_cache_files_through(fuse_env, mountpoint):
    """``--read-mode passthrough``: the first read of a multi-block file goes through READ and stores
    every block of the version in its one cache file on the disk level; a later open is answered
    with FOPEN_PASSTHROUGH onto that file (the daemon's log counts it) and reads the same bytes."""
    pid = mount(fuse_env, mountpoint, "--read-mode", "passthrough")
    log = read_state(fuse_env.home, mountpoint)["log"]
    path, want = os.path.join(mountpoint, "local/big.bin"), fuse_env.expected["local/big.bin"]
    try:
        assert "passthrough of complete cached files" in _log(fuse_env.home, mountpoint)
        assert sha256_path(path) == want  # through READ; the version is now complete in the cache
        whole = lambda: [p for p in glob.glob(os.path.join(fuse_env.home, "**", "files", "*"), recursive=True)
                         if os.path.isfile(p) and os.stat(p).st_blocks * 512 >= BIG_SIZE]  # noqa: E731
        wait_until(lambda: sha256_path(path) == want and whole(), 30, "the disk tier to hold all of big.bin")
        time.sleep(0.2)  # the previous handle's RELEASE arrives (an inode is not passed through
        with open(path, "rb") as keeper:  # while a handle reading through the page cache is open)
            assert hashlib.sha256(keeper.read()).hexdigest() == want  # passed through; while open, the
            for _ in range(3):  # inode is not forgotten (a drop_caches by a test beside would do it)
                assert sha256_path(path) == want
        r = cli("unmount", mountpoint, home=fuse_env.home)  # the daemon exits and logs its counts
        assert r.returncode == 0 and "exited" in r.stdout, r.stdout + r.stderr
    finally:
        force_cleanup(fuse_env.home, mountpoint, pid)
    wait_until(lambda: "opens passed through" in open(log, encoding="utf-8").read(), 30, "the daemon's last words")
    with open(log, encoding="utf-8") as f:
        ended = [line for line in f if "opens passed through" in line][-1]
    said = re.findall(r"(?:backing files registered|opens passed through|answered by the compiled loop): (\d+)", ended)
    registered, passed, in_c = (int(n) for n in said)
    forgets = sum(int(n) for n in re.findall(r"\b(?:BATCH_)?FORGET (\d+)", ended))
    # the reopens reused the first open's backing id: one more only if the kernel forgot the inode
    # between the wait above and the keeper's open (a drop_caches beside), which lets the id go
    assert passed >= 4 and registered <= 1 + forgets and registered < passed, ended
    assert in_c >= 1, ended  # a reopen after the first passthrough open: answered without Python


def _deleted_fds(pid: int) -> list[str]:
    """The targets of ``pid``'s descriptors that name unlinked files."""
    fds = os.path.join("/proc", str(pid), "fd")
    targets = []
    for n in os.listdir(fds):
        with contextlib.suppress(FileNotFoundError):
            targets.append(os.readlink(os.path.join(fds, n)))
    return [t for t in targets if t.endswith(" (deleted)")]


def test_an_evicted_cache_file_is_let_go_by_an_idle_daemon_and_a_reopen_reads_the_ufs_bytes(fuse_env, mountpoint):
    """A backing id kept for an inode's next open pins its cache file; once the cache file is
    unlinked (what eviction by any process does to a file handed out whole) the daemon lets it
    go within a second with no open to prompt it (an idle daemon held 41 MiB of a 200 MiB cache
    device for 12 minutes), and the next open does not reuse it: the bytes come from the UFS."""
    pid = mount(fuse_env, mountpoint, "--read-mode", "passthrough")
    path, want = os.path.join(mountpoint, "local/big.bin"), fuse_env.expected["local/big.bin"]
    whole = lambda: [p for p in glob.glob(os.path.join(fuse_env.home, "**", "files", "*"), recursive=True)  # noqa: E731
                     if os.path.isfile(p) and os.stat(p).st_blocks * 512 >= BIG_SIZE]
    try:
        assert sha256_path(path) == want
        wait_until(lambda: sha256_path(path) == want and whole(), 30, "the disk tier to hold all of big.bin")
        time.sleep(0.2)  # the last handle's RELEASE arrives: its backing id is kept idle
        (cache_file,) = whole()
        os.unlink(cache_file)  # as the tier's eviction of a file handed out whole does
        wait_until(lambda: _deleted_fds(pid) == [], 5, "the idle daemon to close the unlinked file")
        assert sha256_path(path) == want  # not the unlinked file's: the index is asked again
        assert _deleted_fds(pid) == []
    finally:
        assert cli("unmount", mountpoint, home=fuse_env.home).returncode == 0
        force_cleanup(fuse_env.home, mountpoint, pid)


def test_auto_read_mode_follows_what_the_dataset_holds(fuse_env, mountpoint):
    """``--read-mode auto`` (the default): the shared dataset's bytes are mostly in multi-block
    files, so it mounts in passthrough mode and the log says so and why; the choice is the rule
    computed from the manifest (files over 4 MiB and one block hold at least half of the bytes)."""
    from datacache_fuse.daemon import choose_read_mode
    from datacache.control.embedded import read_path

    r = cli("mount", fuse_env.name, mountpoint, "--background", home=fuse_env.home)
    pid = int(re.search(r"pid (\d+)", r.stdout).group(1)) if "pid " in r.stdout else None
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        said = [line for line in r.stdout.splitlines() if line.startswith("read mode: ")]
        assert len(said) == 1 and said[0].startswith("read mode: passthrough: ") and "--read-mode no-open" in said[0], \
            r.stdout
        assert said[0] in _log(fuse_env.home, mountpoint)  # the same line as the daemon logged
        assert ", a file handle per open," in _log(fuse_env.home, mountpoint)
    finally:
        assert cli("unmount", mountpoint, home=fuse_env.home).returncode == 0
        force_cleanup(fuse_env.home, mountpoint, pid)
    r = cli("mount", fuse_env.name, mountpoint, "--background", "--read-mode", "no-open", home=fuse_env.home)
    pid = int(re.search(r"pid (\d+)", r.stdout).group(1)) if "pid " in r.stdout else None
    try:
        assert r.returncode == 0 and "read mode: no-open: " in r.stdout and "(as asked)\n" in r.stdout, \
            r.stdout + r.stderr
    finally:
        assert cli("unmount", mountpoint, home=fuse_env.home).returncode == 0
        force_cleanup(fuse_env.home, mountpoint, pid)
    paths = read_path(fuse_env.home)
    client = paths.open_dataset(fuse_env.name)
    try:
        handles, why = choose_read_mode(client)
        total = client.manifest.total_size
        large_from = max(4 << 20, client.block_size)
        large = sum(e.size for e in client.manifest if e.size > large_from)
        assert handles == (2 * large >= total) and why.startswith(f"{100 * large // total}% of ")
    finally:
        client.close()
        paths.close()


def test_reopens_answered_by_the_compiled_loop_still_tell_the_read_listeners(fuse_env, mountpoint):
    """A dataset mount's passthrough reopens are answered by the compiled loop without Python, yet
    the client's read listeners (plan follower, file read-ahead, ``--record``) still learn of each
    one, as an OPEN answered by Python tells them; the bytes are the file's. Served in-process (the
    daemon's own classes) to watch the listeners."""
    from datacache.control.embedded import read_path
    from datacache_fuse.kernel.server import FuseServer
    from datacache_fuse.kernel_ops import DatasetOperations

    paths = read_path(fuse_env.home)
    client = paths.open_dataset(fuse_env.name, "default")
    told: list[str] = []
    client.on_read(lambda entry: told.append(entry.path))
    server = FuseServer(DatasetOperations(client, no_open=False, passthrough=True, reload_interval=None), mountpoint,
                        passthrough=True)
    session = server.start()
    name, want = "local/big.bin", fuse_env.expected["local/big.bin"]
    path = os.path.join(mountpoint, name)
    try:
        assert session.backing.fast is not None, "datacache_fuse.kernel._pump was not built"

        def passed_through() -> bool:
            assert sha256_path(path) == want  # through READ until the cache holds the whole version
            return session.backing.fast.opens > 0  # listed by a passthrough OPEN, then reopened in C
        wait_until(passed_through, 60, "a reopen answered by the compiled loop")
        wait_until(lambda: told.count(name) == len(told), 5, "the reopen told")
        before, opens = len(told), session.backing.fast.opens
        for _ in range(3):
            with open(path, "rb", buffering=0) as f:
                assert sha256(f.read()) == want
        assert session.backing.fast.opens == opens + 3
        wait_until(lambda: len(told) == before + 3, 5, "each reopen told to the read listeners")
        assert set(told) == {name}
    finally:
        assert server.stop(timeout=10)
        client.close()
        paths.close()
