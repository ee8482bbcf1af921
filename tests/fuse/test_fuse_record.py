"""``datacache mount --record`` (issue 21 item 4): the files read through a real mount, in the
order of their first read, become the run's trace, in both read modes."""

from __future__ import annotations

import os

import pytest

from datacache.plan.trace import read_trace
from fuse_support import cli, force_cleanup, mount, sha256, wait_until


@pytest.mark.parametrize("mode", ["no-open", "passthrough"])
def test_mount_record_writes_the_runs_trace(fuse_env, mountpoint, mode):
    run = f"fuse-{mode}"
    order = [p for p in fuse_env.shared_files if p.startswith("s3/")][:3][::-1]
    pid = mount(fuse_env, mountpoint, "--read-mode", mode, f"--record={run}")
    try:
        for path in order:
            with open(os.path.join(mountpoint, path), "rb") as f:
                assert sha256(f.read()) == fuse_env.expected[path]
        assert cli("unmount", mountpoint, home=fuse_env.home).returncode == 0
        wait_until(lambda: not os.path.exists(f"/proc/{pid}"), 10, "the daemon to exit")
    finally:
        force_cleanup(fuse_env.home, mountpoint, pid)
    ddir = os.path.join(fuse_env.home, "datasets", "default", fuse_env.name)
    assert read_trace(ddir, fuse_env.name, run) == (run, [(p, fuse_env.sizes[p]) for p in order])
