"""The dataset mount on datacache's own FUSE transport (``datacache mount --transport kernel``).

Every test of ``test_fuse_read`` (checksums, walk, stat, C6-C8, EROFS, xattrs, statfs, keep_cache,
1 MiB requests) and ``test_fuse_versions`` (version pinning, ESTALE, a sync reaching a running
mount, inode numbers) runs again here, with ``DATACACHE_FUSE_TRANSPORT=kernel`` in the
environment of the daemons the CLI starts, a mount and a dataset home of this module's own
(``test_xattr_cached_fraction`` needs a file no earlier test read).
"""

from __future__ import annotations

import os

import pytest

import test_fuse_read
import test_fuse_versions
from fuse_support import build_env, force_cleanup, mount
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
        from datacache_fuse.daemon import read_state

        with open(read_state(fuse_env.home, mp)["log"], encoding="utf-8") as f:
            assert "with the kernel transport" in f.read()
        yield mp
    finally:
        force_cleanup(fuse_env.home, mp, pid)
