"""UFS outage seen through a real FUSE mount: cached files read right, an uncached file fails with
EIO within the bound (never a hang, never blocking the cached reads), then reads by itself again."""

from __future__ import annotations

import errno
import os
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fuse"))

from fault_support import apply_proxied, read_all, sha, timed  # noqa: E402
from fuse_support import HAVE_FUSE, SKIP_REASON, force_cleanup, mount  # noqa: E402
from test_ufs_outage import BOUND_S  # noqa: E402

pytestmark = pytest.mark.skipif(not HAVE_FUSE, reason=SKIP_REASON)


class _Env:  # what fuse_support.mount needs
    def __init__(self, home: str, name: str):
        self.home, self.name = home, name


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


@pytest.fixture
def mounted(datacache_home, moto_secrets, fault_moto, proxy, bucket_of, objects, tmp_path):
    plane = apply_proxied(datacache_home, "fuseout", fault_moto, proxy, bucket_of(objects))
    client = plane.open_dataset("fuseout")
    assert sha(read_all(client, "cached.bin")) == sha(objects["cached.bin"])  # cached on disk
    client.close()
    plane.close()
    mp = str(tmp_path / "mnt")
    os.makedirs(mp)
    pid = None
    try:
        pid = mount(_Env(str(datacache_home), "fuseout"), mp)
        yield mp
    finally:
        force_cleanup(str(datacache_home), mp, pid)


@pytest.mark.parametrize("fault", ["stall", "503", "reset"])
def test_fuse_outage_eio_then_recovers(mounted, proxy, objects, fault):
    cold = os.path.join(mounted, "cold-0.bin")
    proxy.set_mode(fault)
    failed: list = []
    reader = threading.Thread(target=lambda: failed.append(timed(lambda: _read_file(cold))))
    reader.start()
    time.sleep(0.3)  # the uncached read is now waiting on the source
    data, took = timed(lambda: _read_file(os.path.join(mounted, "cached.bin")))
    assert sha(data) == sha(objects["cached.bin"])
    assert took < 2.0, f"a cached read waited {took:.1f} s behind an uncached one"
    reader.join(BOUND_S + 5)
    assert not reader.is_alive(), "an uncached read through FUSE hung"
    err, took = failed[0]
    assert isinstance(err, OSError) and err.errno == errno.EIO, repr(err)
    assert took < BOUND_S

    proxy.set_mode("pass")
    assert sha(_read_file(cold)) == sha(objects["cold-0.bin"])
