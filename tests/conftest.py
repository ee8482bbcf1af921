"""Shared fixtures: a real moto S3 server over HTTP, fresh buckets, an isolated DATACACHE_HOME.

Checksum helpers live in ``datacache.demo.sample_data`` (``sha256_bytes``, ``sha256_file``) so tests,
the demo and benchmarks share one definition.
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid

import pytest

from datacache.demo.s3server import MotoServer


def _interrupt_on_term(pid: int) -> None:
    """SIGTERM raises KeyboardInterrupt in process ``pid`` (pytest's: it then tears its fixtures
    down); a child forked by a test still dies of it, as by default."""
    def interrupted(signum, frame):
        if os.getpid() != pid:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, interrupted)


def pytest_configure(config: pytest.Config) -> None:
    # FUSE daemons started by this process's tests end with it, even when the run is killed (19.17).
    os.environ["DATACACHE_FUSE_WATCH_PID"] = str(os.getpid())
    # A terminated run tears its fixtures down as an interrupted one does: mounts served by a thread
    # of this process (tests/fuse/test_kernel_transport.py) are unmounted, not left dead.
    _interrupt_on_term(os.getpid())
    # The tiers live on the host's /tmp: its share free is the host's (a CI host had under a tenth,
    # and every put kept a tenth free). The tests of the reserve itself name theirs.
    os.environ["DATACACHE_FREE_SPACE_RATIO"] = "0.01"
    config.addinivalue_line("markers", "slow: long-running test (deselect with -m 'not slow')")


# Files of 30 s or more (measured with 2 CPUs), longest first. `make test` (--dist loadfile
# --no-loadscope-reorder) hands whole files to its two workers in collection order, so these run
# first and the short files fill in at the end. xdist's default order (files with fewest tests
# first) queued the one-test demo and soak files last, on one worker, while the other sat idle.
LONG_FILES = (
    "tests/test_benchmarks_smoke.py",
    "tests/test_demo.py",
    "tests/faults/test_soak.py",
    "tests/faults/test_worker_kill.py",
    "tests/faults/test_process_kill.py",
    "tests/sync/test_sync_million.py",
    "tests/fuse/test_fuse_memory.py",
    "tests/test_benchmarks_timeout.py",
    "tests/test_benchmarks_http_smoke.py",
    "tests/juicefs/test_juicefs_runtime.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the tests of :data:`LONG_FILES` first, in that order; the rest keep their order."""
    rank = {path: i for i, path in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.fixture(scope="session")
def moto_server():
    """moto's S3 server in a child process on 127.0.0.1, shared by the whole session; a ranged GET
    reads only its range from the stored object (``MotoServer``'s default ``ranges="stored"``)."""
    with MotoServer() as server:
        yield server


@pytest.fixture
def s3_bucket(moto_server: MotoServer):
    """``(s3fs, bucket)``: a fresh, uniquely named, empty bucket; emptied and removed afterwards."""
    fs = moto_server.s3fs()
    bucket = f"test-{uuid.uuid4().hex[:16]}"
    fs.mkdir(bucket)
    yield fs, bucket
    try:
        fs.invalidate_cache()
        fs.rm(bucket, recursive=True)
    except FileNotFoundError:
        pass


@pytest.fixture
def datacache_home(tmp_path, monkeypatch):
    """A temporary directory set as ``$DATACACHE_HOME`` for the test."""
    home = tmp_path / "datacache-home"
    home.mkdir()
    monkeypatch.setenv("DATACACHE_HOME", str(home))
    return home


@pytest.fixture
def moto_secrets(monkeypatch):
    """The secret ``moto`` (keys ``key``/``secret``) that ``support.s3_mount`` refers to."""
    monkeypatch.setenv("DATACACHE_SECRET_MOTO_KEY", "testing")
    monkeypatch.setenv("DATACACHE_SECRET_MOTO_SECRET", "testing")


def _mounted(tmp_path, fstype: str, *options: str):
    """A fresh ``fstype`` mount under ``tmp_path`` for the test, unmounted after (root only)."""
    if os.geteuid() != 0:
        pytest.skip(f"mounting {fstype} needs root (CI runs as root)")
    where = tmp_path / fstype
    where.mkdir()
    subprocess.run(["mount", "-t", fstype, *options, fstype, str(where)], check=True)
    yield where
    subprocess.run(["umount", "-l", str(where)], check=True)


@pytest.fixture
def ramfs(tmp_path):
    """A ramfs mount (it refuses O_DIRECT: EINVAL at open; and fallocate: EOPNOTSUPP)."""
    yield from _mounted(tmp_path, "ramfs")


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 6 MiB tmpfs mount: a device that fills."""
    yield from _mounted(tmp_path, "tmpfs", "-o", "size=6m")


@pytest.fixture
def nearly_full_tmpfs(tmp_path):
    """A 128 MiB tmpfs mount with 8 % of it free (a file ``ballast`` takes the rest): above the
    suite's free-space reserve (``DATACACHE_FREE_SPACE_RATIO`` 0.01), below the usual 0.1, as on
    a host whose disk is nearly full."""
    for where in _mounted(tmp_path, "tmpfs", "-o", "size=128m"):
        st = os.statvfs(where)
        with open(where / "ballast", "wb") as f:
            f.write(bytes(st.f_blocks * st.f_frsize * 92 // 100))
        yield where
