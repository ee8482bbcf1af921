"""The dataset mount on datacache's own FUSE transport (``datacache mount --transport kernel``).

Every test of ``test_fuse_read`` (checksums, walk, stat, C6-C8, EROFS, xattrs, statfs, keep_cache,
1 MiB requests) and ``test_fuse_versions`` (version pinning, ESTALE, a sync reaching a running
mount, inode numbers) runs again here, with ``DATACACHE_FUSE_TRANSPORT=kernel`` in the
environment of the daemons the CLI starts, a mount and a dataset home of this module's own
(``test_xattr_cached_fraction`` needs a file no earlier test read).
"""

from __future__ import annotations

import glob
import os
import time

import pytest

import test_fuse_read
import test_fuse_versions
from datacache_fuse.daemon import read_state
from fuse_support import BIG_SIZE, build_env, force_cleanup, mount, sha256_path, wait_until
from test_fuse_versions import versioned  # noqa: F401 - the fixture of the imported tests

globals().update({name: getattr(module, name) for module in (test_fuse_read, test_fuse_versions)
                  for name in dir(module) if name.startswith("test_")})

TRANSPORT_VAR = "DATACACHE_FUSE_TRANSPORT"


@pytest.fixture(scope="module", autouse=True)
def kernel_transport():
    """Daemons started while this module runs use the kernel transport."""
    old = os.environ.get(TRANSPORT_VAR)
    os.environ[TRANSPORT_VAR] = "kernel"
    yield
    if old is None:
        del os.environ[TRANSPORT_VAR]
    else:
        os.environ[TRANSPORT_VAR] = old


@pytest.fixture(scope="module")
def fuse_env(fuse_available, tmp_path_factory, fuse_moto):
    """The test dataset under a home and bucket of this module's own."""
    return build_env(str(tmp_path_factory.mktemp("fuse-kernel")), fuse_moto, "fusebkt-kernel")


@pytest.fixture(scope="module")
def mnt(kernel_transport, fuse_env, tmp_path_factory) -> str:
    """The dataset mounted on the kernel transport; the log says which transport served it."""
    mp = str(tmp_path_factory.mktemp("mnt-kernel"))
    pid = None
    try:
        pid = mount(fuse_env, mp)
        with open(read_state(fuse_env.home, mp)["log"], encoding="utf-8") as f:
            assert "with the kernel transport" in f.read()
        yield mp
    finally:
        force_cleanup(fuse_env.home, mp, pid)


def test_open_handles_pass_file_tier_files_through(kernel_transport, fuse_env, tmp_path):
    """``--open-handles`` on the kernel transport: the first read of a multi-block file goes
    through READ and puts the complete version into the file tier; a later open is answered with
    FOPEN_PASSTHROUGH onto that file (the daemon's log counts it) and reads the same bytes."""
    mp = str(tmp_path / "mnt")
    os.makedirs(mp)
    pid = mount(fuse_env, mp, "--open-handles")
    log = read_state(fuse_env.home, mp)["log"]
    path, want = os.path.join(mp, "local/big.bin"), fuse_env.expected["local/big.bin"]
    try:
        assert sha256_path(path) == want  # through READ; the version is now complete in the cache
        tiered = lambda: [p for p in glob.glob(os.path.join(fuse_env.home, "**", "*.files", "**"), recursive=True)
                          if os.path.isfile(p) and os.path.getsize(p) == BIG_SIZE]  # noqa: E731
        wait_until(lambda: sha256_path(path) == want and tiered(), 30, "the file tier to hold big.bin")
        for _ in range(3):
            time.sleep(0.2)  # the previous handle's RELEASE arrives (an inode is not passed through
            assert sha256_path(path) == want  # while a handle reading through the page cache is open)
    finally:
        force_cleanup(fuse_env.home, mp, pid)
    wait_until(lambda: "opens passed through" in open(log, encoding="utf-8").read(), 30, "the daemon's last words")
    with open(log, encoding="utf-8") as f:
        ended = [line for line in f if "opens passed through" in line][-1]
    assert int(ended.rsplit(":", 1)[1]) >= 1, ended
    assert "passthrough of file-tier files" in open(log, encoding="utf-8").read()
