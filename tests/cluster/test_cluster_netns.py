"""Each cache worker on its own test host: a network namespace joined to this one by a veth pair
(iproute2). One host is cut off (its link set down) in the middle of a read: the read goes on,
slower, through the next-ranked worker, and returns every byte. The namespaces and links are
removed in ``finally``. Needs root and ``ip``; skipped otherwise."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import time

import pytest

from cluster_support import MiB, disrupt_mid_read, live, open_client, reap, stored_keys, wait_for, write_files
from datacache.api.loader import load_resource_dict
from datacache.cluster.auth import ensure_token
from datacache.control.embedded import Embedded
from datacache.warmup import warmup

NAME = "ns"
BLOCK = 256 << 10


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def _netns_works() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    probe = f"dcprobe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except (subprocess.CalledProcessError, OSError):
        return False
    _ip("netns", "del", probe)
    return True


pytestmark = pytest.mark.skipif(not _netns_works(), reason="needs root and iproute2 network namespaces")


@pytest.fixture
def hosts():
    """Three namespaces ``(netns, host-side link, address)``, each reachable from here."""
    made, subnet = [], random.randrange(20, 250)
    try:
        for i in range(3):
            ns, link, peer = f"dcw{os.getpid()}-{i}", f"dcv{os.getpid() % 100000}{i}", f"dcp{os.getpid() % 100000}{i}"
            _ip("netns", "add", ns)
            made.append((ns, link, f"10.{subnet}.{i}.2"))
            _ip("link", "add", link, "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", ns)
            _ip("addr", "add", f"10.{subnet}.{i}.1/24", "dev", link)
            _ip("link", "set", link, "up")
            _ip("-n", ns, "addr", "add", f"10.{subnet}.{i}.2/24", "dev", peer)
            _ip("-n", ns, "link", "set", peer, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield made
    finally:
        for ns, link, _ in made:
            subprocess.run(["ip", "link", "del", link], capture_output=True, timeout=30)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def test_a_host_cut_off_mid_read(cluster_home, tmp_path, hosts):
    src = tmp_path / "src"
    contents = write_files(src, {f"f{i:02d}.bin": MiB + i for i in range(12)})
    docs = [{"apiVersion": "datacache.io/v1alpha1", "kind": "Dataset", "metadata": {"name": NAME},
             "spec": {"mounts": [{"name": "local", "mountPoint": str(src)}]}},
            {"apiVersion": "datacache.io/v1alpha1", "kind": "CacheRuntime", "metadata": {"name": NAME},
             "spec": {"replicas": 1, "blockSize": "256Ki",  # workers started here, one per host
                      "tieredstore": {"levels": [{"mediumtype": "SSD", "path": "cache", "quota": "256Mi"}]}}}]
    plane = Embedded(str(cluster_home))
    plane.apply([load_resource_dict(d, "test") for d in docs])
    ensure_token(plane.home, "default", NAME)
    procs = [subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "datacache", "worker", "serve", NAME,
                               "--home", plane.home, "--index", str(i), "--host", addr],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for i, (ns, _, addr) in enumerate(hosts)]
    try:
        wait_for(lambda: len(live(cluster_home, NAME)) == 3, 60, "three workers on three hosts")
        assert {m.url.split("//")[1].rsplit(":", 1)[0] for m in live(cluster_home, NAME).values()} == \
            {addr for _, _, addr in hosts}
        client = open_client(plane, NAME, short_circuit=False, connect_timeout=0.5, read_timeout=1.0)
        assert warmup(client).ok
        assert all(stored_keys(cluster_home, NAME).values())

        def files():
            for path in contents:
                with client.open(path) as f:
                    yield path, f.read()
                time.sleep(0.05)

        cut = hosts[1][1]  # worker-1's host drops off the network after 4 files
        got = disrupt_mid_read(files(), 4, lambda: _ip("link", "set", cut, "down"))
        assert dict(got) == contents
        # worker-1's blocks were read through the next-ranked workers, which filled them.
        misses = {w: m.get("datacache_worker_misses_total", 0) for w, m in client.source.worker_metrics().items()}
        assert "worker-1" not in misses and sum(misses.values()) > 0
        client.close()
    finally:
        for p in procs:  # stopped before the hosts go away
            p.terminate()
        try:
            for p in procs:
                p.wait(15)
        finally:
            reap(cluster_home)  # SIGKILL for any that did not stop
            plane.close()
