"""Fixtures of the ThinRuntime tests: one real sshd per session, a fresh DATACACHE_HOME per test.

Clean-up never depends on a test passing: each test's home is swept in ``finally`` (every thin
runtime's FUSE command stopped, every mount under it detached), the server is stopped at the end of
the session, and each test asserts that nothing it started is left.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess

import pytest

from datacache_runtimes.fusecmd import FuseCommand
from thin_support import ODD, SSHD, SSHServer, mounts_under


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    """A running :class:`SSHServer` (skipped, with the reason, where openssh-server is missing)."""
    if not os.path.exists(SSHD) or shutil.which("ssh-keygen") is None:
        pytest.skip("openssh-server is not installed (Debian: apt-get install openssh-server)")
    server = SSHServer(str(tmp_path_factory.mktemp("sshd")))
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def sshfs_available():
    if shutil.which("sshfs") is None or not os.path.exists("/dev/fuse"):
        pytest.skip("sshfs or /dev/fuse is missing (Debian: apt-get install sshfs fuse3)")


@pytest.fixture
def thin_home(tmp_path, monkeypatch):
    """``$DATACACHE_HOME`` for one test; afterwards no thin runtime's command or mount remains."""
    yield from _home(tmp_path, monkeypatch, "home")


@pytest.fixture
def odd_home(tmp_path, monkeypatch):
    """Like ``thin_home``, at a path with spaces and shell metacharacters (:data:`ODD`)."""
    yield from _home(tmp_path, monkeypatch, f"home {ODD}")


def _home(tmp_path, monkeypatch, name: str):
    home = str(tmp_path / name)
    os.makedirs(home, mode=0o700)
    monkeypatch.setenv("DATACACHE_HOME", home)
    try:
        yield home
    finally:
        for state in glob.glob(os.path.join(glob.escape(home), "runtimes", "*", "*", "thin", "fuse.json")):
            ns, name = state.split(os.sep)[-5:-3]
            FuseCommand(home, ns, name).stop()
        for point in mounts_under(str(tmp_path)):
            subprocess.run(["fusermount3", "-u", "-z", point], capture_output=True)
        assert not mounts_under(str(tmp_path)), "mounts left behind"
