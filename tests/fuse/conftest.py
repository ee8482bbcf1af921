"""Fixtures for real FUSE mounts of a small dataset over moto's S3 server and a local directory.

The dataset (``fusetest``, 39 files, ~68 MiB) has small files, PNG/JPEG images, a Parquet table
and the awkward names of case C7 on S3, and the large files on a local mount (moto reads a whole
object for every ranged GET, so large S3 objects would measure moto). Every test reads through a
mount made by the real CLI (``python -m datacache_fuse mount --background``) and compares with
the source's SHA-256.

Tests that need no mount (units of the package) do not use these fixtures and run everywhere.

Clean-up never depends on a test passing: each mount fixture lazily unmounts in ``finally`` and
kills its daemon, and the session ends by asserting that no FUSE mount of ours is left.

Tests that mount are skipped, with the reason, only when ``/dev/fuse`` is absent.
"""

from __future__ import annotations

import os

import pytest

from fuse_support import HAVE_FUSE, SKIP_REASON, FuseEnv, build_env, force_cleanup, mount


# -- fixtures --------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def fuse_available():
    """Skips the test (with the reason) when the kernel offers no FUSE; every fixture that mounts
    depends on it, so tests that need no mount run everywhere."""
    if not HAVE_FUSE:
        pytest.skip(SKIP_REASON)


@pytest.fixture(scope="session")
def fuse_moto():
    """A moto S3 server of our own (other tests may reset the shared one)."""
    from datacache.demo.s3server import MotoServer

    with MotoServer() as server:
        yield server


@pytest.fixture(scope="session")
def fuse_env(fuse_available, tmp_path_factory, fuse_moto) -> FuseEnv:
    """The dataset ``fusetest`` applied under a fresh DATACACHE_HOME."""
    env = build_env(str(tmp_path_factory.mktemp("fuse")), fuse_moto, "fusebkt")
    yield env
    root = str(tmp_path_factory.getbasetemp())
    leftovers = [line for line in open("/proc/self/mounts") if root in line]
    assert not leftovers, f"FUSE mounts left behind: {leftovers}"


@pytest.fixture(scope="session")
def mnt(fuse_env, tmp_path_factory) -> str:
    """The dataset mounted once for the read-only tests (daemon in the background)."""
    mp = str(tmp_path_factory.mktemp("mnt-shared"))
    pid = None
    try:
        pid = mount(fuse_env, mp)
        yield mp
    finally:
        force_cleanup(fuse_env.home, mp, pid)


@pytest.fixture
def mountpoint(fuse_env, tmp_path):
    """A fresh mount point for a test that mounts by itself; cleaned up whatever happens."""
    mp = str(tmp_path / "mnt")
    os.makedirs(mp)
    yield mp
    force_cleanup(fuse_env.home, mp)
