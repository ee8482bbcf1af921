"""The two ways a file is opened: the kernel's no-open mode (pyfuse3 with datacache's read patch,
the default) and a file handle per open (``--open-handles``, the only mode with stock pyfuse3).

Each FUSE request the daemon serves is one read(2) of /dev/fuse, so the daemon's ``syscr`` in
/proc/PID/io counts requests: re-opening page-cached files must cost nothing in no-open mode and
an OPEN plus a RELEASE per file with handles. (Python's buffered ``open()`` also calls isatty(),
an IOCTL request the kernel sends to every FUSE file system; libfuse answers it without the
file system, and unbuffered opens do not make it.)"""

from __future__ import annotations

import os

import pytest

from fuse_support import daemon_pid, force_cleanup, mount, sha256, sha256_path, wait_until


def _read_syscalls(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        return int(dict(line.split(": ") for line in f.read().splitlines())["syscr"])


def test_pyfuse3_is_built_with_the_read_patch():
    import pyfuse3

    assert getattr(pyfuse3, "READ_FH_ZERO_IS_INODE", False) is True, (
        "pyfuse3 lacks datacache's read patch: run 'python fuse/build_pyfuse3.py' (make venv does)")
    assert callable(getattr(pyfuse3, "main_readable", None)), (
        "pyfuse3 lacks datacache's main loop: run 'python fuse/build_pyfuse3.py' (make venv does)")


def test_more_requests_at_once_than_the_loop_runs_tasks_all_answered(fuse_env, fuse_moto, mountpoint):
    """96 threads read 96 cold files at once (each READ waits on a GET from moto); the daemon's
    loop runs at most 64 handler tasks and stops reading /dev/fuse until one ends. Every byte
    comes back right, with buffered opens (an IOCTL each) mixed in, and the daemon still serves."""
    import threading

    import numpy as np

    from fuse_support import S3_KEY, S3_SECRET, apply_dataset

    rng = np.random.default_rng(13)
    objects = {f"g{i:03d}.bin": rng.bytes(int(rng.integers(200_000, 600_000))) for i in range(96)}
    fs = fuse_moto.s3fs(key=S3_KEY, secret=S3_SECRET)
    fs.mkdir("fuseburst")
    fs.pipe({f"fuseburst/data/{k}": v for k, v in objects.items()})
    apply_dataset(fuse_env.home, "burst", fuse_moto.endpoint_url, "fuseburst", None)
    start = threading.Barrier(len(objects))
    got: dict[str, str] = {}

    def read(rel: str, buffered: bool) -> None:
        start.wait()
        with open(os.path.join(mountpoint, rel), "rb", buffering=-1 if buffered else 0) as f:
            got[rel] = sha256(f.read())

    pid = None
    try:
        pid = mount(fuse_env, mountpoint, name="burst")
        threads = [threading.Thread(target=read, args=(rel, i % 2 == 0)) for i, rel in enumerate(objects)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert {rel: sha256(data) for rel, data in objects.items()} == got
        assert os.listdir(mountpoint)  # the daemon still serves
    finally:
        force_cleanup(fuse_env.home, mountpoint, pid)


@pytest.mark.parametrize("mode, extra", [("no-open", ()), ("handles", ("--open-handles",))])
def test_warm_reopens_cost_the_daemon_no_request_only_in_no_open_mode(fuse_env, mountpoint, mode, extra):
    files = sorted(p for p in fuse_env.shared_files if p.startswith("s3/small/"))
    assert len(files) >= 10
    pid = None
    try:
        pid = mount(fuse_env, mountpoint, *extra)
        daemon = wait_until(lambda: daemon_pid(fuse_env.home, mountpoint), 10, "the daemon's state file")
        for rel in files:  # epoch 1: lookups, reads, page cache filled
            assert sha256_path(os.path.join(mountpoint, rel)) == fuse_env.expected[rel], rel
        rounds = 20
        before = _read_syscalls(daemon)
        for _ in range(rounds):  # later epochs: page-cached files opened again
            for rel in files:
                with open(os.path.join(mountpoint, rel), "rb", buffering=0) as f:  # no isatty ioctl
                    assert sha256(f.read()) == fuse_env.expected[rel], rel
        requests = _read_syscalls(daemon) - before
        opens = rounds * len(files)
        if mode == "no-open":
            assert requests < opens // 10, f"{requests} requests for {opens} page-cached opens"
        else:
            assert requests >= 2 * opens, f"{requests} requests for {opens} opens (OPEN + RELEASE each)"
    finally:
        force_cleanup(fuse_env.home, mountpoint, pid)


def test_no_open_mode_reads_many_files_at_once_past_the_kept_readers(fuse_env, fuse_moto, mountpoint):
    """More files read interleaved than the daemon keeps per-inode Readers for (INODE_READERS):
    every byte still right, page cache dropped first so every read reaches the daemon."""
    import numpy as np

    from datacache_fuse.ops import INODE_READERS
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
