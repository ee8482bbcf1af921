"""Fixtures for the JuiceFSRuntime tests: the real ``juicefs`` binary (the module is skipped when
it is not installed), a volume with SQLite metadata and data on moto's S3, and a sweep that leaves
no juicefs process or mount of the test behind."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

from datacache import mountinfo
import jfs_support


@pytest.fixture(scope="session")
def juicefs_binary(tmp_path_factory):
    """Path of the juicefs binary; skips when it is missing. Registers the engine's entry point."""
    from datacache_runtimes import juicefs_cli
    from datacache.errors import ResourceError

    try:
        binary = juicefs_cli.binary()
    except ResourceError as err:
        pytest.skip(f"the JuiceFS client is not installed ({err})")
    jfs_support.ensure_entry_point(str(tmp_path_factory.mktemp("entry-point")))
    return binary


@pytest.fixture
def no_leftovers(tmp_path):
    """After the test: SIGKILL any process whose command line names ``tmp_path`` (juicefs clients,
    launchers) and lazily unmount every mount below it, then fail if there were any."""
    yield
    root = str(tmp_path)
    found = jfs_support.processes_naming(root)
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    mounts = [m.mountpoint for m in mountinfo.mounts() if m.mountpoint.startswith(root)]
    for point in sorted(mounts, key=len, reverse=True):
        with contextlib.suppress(OSError):
            mountinfo.lazy_unmount(point)
    time.sleep(0.2)
    assert not found and not mounts, f"left behind: processes {found}, mounts {mounts}"
