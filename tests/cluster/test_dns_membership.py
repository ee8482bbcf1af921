"""DNS membership (Kubernetes' headless Service) against a real DNS server on loopback.

A dnslib DNSServer answers, like Kubernetes DNS does for the headless Service ``dnsrt-worker``,
one SRV record per ready worker (``_http._tcp.dnsrt-worker.default.svc.cluster.local``) with its
target's A record in the additional section; its ready workers are the real worker processes
of a 3-worker runtime (their ports read from the embedded membership). Workers and clients are
switched to DNS membership by the environment the operator sets in pods. Checked: warmup + reads
(sha256 of bytes) with every block on its HRW owner, a worker removed from DNS no longer asked,
DaemonSet-style targets identified through /healthz, and a DNS server that goes down: the last
answer is kept for the stale bound, then a clear error.
"""

from __future__ import annotations

import hashlib
import socket
import time
import urllib.parse
import urllib.request

import pytest
from dnslib import QTYPE, RCODE, RR, SRV, A
from dnslib.server import BaseResolver, DNSLogger, DNSServer
from prometheus_client.parser import text_string_to_metric_families

from cluster_support import MiB, apply_cluster, block_bytes, live, open_client, reap, stored_keys, wait_for
from datacache.cluster.discovery import DnsMembership, MembershipUnavailableError, srv_name
from datacache.cluster.placement import owners
from datacache.cluster.client import WorkerClient
from datacache.cluster.peers import Peers
from datacache.cluster.routing import Router
from datacache.dataload import warmup

NAME = "dnsrt"
BLOCK = 256 << 10
WARM = {"a.bin": 3 * BLOCK + 11, "b.bin": 2 * MiB + 5, "dir/c.bin": BLOCK}
COLD = {"later/d.bin": 6 * BLOCK + 1, "later/e.bin": 2 * MiB}
SERVICE = f"{NAME}-worker.default.svc.cluster.local."


class HeadlessService(BaseResolver):
    """The DNS of a headless Service: SRV + A records of the workers that are ``ready`` (live in
    the embedded membership and not in ``hidden``). ``by_address``: name targets after their
    addresses, as Kubernetes does for DaemonSet pods (which have no stable hostname); ``glue``:
    whether the targets' A records ride in the additional section (else they are asked one by one)."""

    def __init__(self, home):
        self.home, self.hidden, self.by_address, self.glue = home, set(), False, True
        self.queries = 0

    def _targets(self) -> dict[str, int]:
        out = {}
        for wid, member in live(self.home, NAME).items():
            if wid not in self.hidden:
                index = member.index
                pod = f"10-0-0-{index}" if self.by_address else f"{NAME}-worker-{index}"
                out[f"{pod}.{SERVICE}"] = urllib.parse.urlsplit(member.url).port
        return out

    def resolve(self, request, handler):
        self.queries += 1
        reply, q = request.reply(), request.q
        qname, targets = str(q.qname), self._targets()
        if qname == srv_name("default", NAME) and q.qtype == QTYPE.SRV:
            for target, port in targets.items():
                reply.add_answer(RR(qname, QTYPE.SRV, ttl=5, rdata=SRV(0, 100, port, target)))
                if self.glue:
                    reply.add_ar(RR(target, QTYPE.A, ttl=5, rdata=A("127.0.0.1")))
        elif qname in targets and q.qtype == QTYPE.A:
            reply.add_answer(RR(qname, QTYPE.A, ttl=5, rdata=A("127.0.0.1")))
        else:
            reply.header.rcode = RCODE.NXDOMAIN
        return reply


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def dns_cluster(module_home, tmp_path_factory):
    """``(plane, zone, server, nameserver, contents)``: 3 workers found through a real DNS server."""
    src = tmp_path_factory.mktemp("src")
    contents = {}
    for name, size in {**WARM, **COLD}.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data := bytes(range(256)) * (size // 256) + b"x" * (size % 256))
        contents[name] = data
    zone = HeadlessService(module_home)
    port = _free_udp_port()
    server = DNSServer(zone, port=port, address="127.0.0.1", logger=DNSLogger(logf=lambda _: None))
    server.start_thread()
    nameserver = f"127.0.0.1:{port}"
    with pytest.MonkeyPatch.context() as env:  # what the operator sets in every pod
        env.setenv("DATACACHE_MEMBERSHIP", "dns")
        env.setenv("DATACACHE_DNS_NAMESERVER", nameserver)
        env.setenv("DATACACHE_HOME", str(module_home))
        plane = apply_cluster(module_home, NAME, [{"name": "local", "mountPoint": str(src), "path": "/"}])
        try:
            yield plane, zone, server, nameserver, contents
        finally:
            plane.close()
            reap(module_home)  # before the DNS server goes: workers ask it until they stop
            if server.isAlive():
                server.stop()


def _data_requests(url: str) -> int:
    """Requests a worker served on its data endpoints (its latency histogram's counts)."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return int(sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
                   if s.name.endswith("_count") and s.labels.get("endpoint", "").startswith("/v1/")))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_warmup_and_reads_follow_dns_membership(dns_cluster, module_home):
    plane, zone, _server, _ns, contents = dns_cluster
    embedded = live(module_home, NAME)
    client = open_client(plane, NAME, short_circuit=False)
    try:
        members = client.source.router.members()
        assert {m.worker_id: m.url for m in members} == {w: m.url for w, m in embedded.items()}
        assert zone.queries > 0

        result = warmup(client, list(WARM))
        assert result.ok, result
        for path in WARM:
            with client.open(path) as f:
                assert _sha(f.read()) == _sha(contents[path]), path
        warm_keys = set(block_bytes([e for e in client.manifest if e.path in WARM], BLOCK, NAME))
        cold_keys = set(block_bytes([e for e in client.manifest if e.path in COLD], BLOCK, NAME))
        assert len(warm_keys) == 3 + 1 + 9 + 1 and len(cold_keys) == 7 + 8
        stored = stored_keys(module_home, NAME)
        for key in warm_keys:  # each block on its HRW owner over the workers DNS lists
            assert key in stored[owners(key, sorted(embedded))[0]], key

        # worker-2 leaves the Service (not ready): no one asks it any more.
        zone.hidden.add("worker-2")
        wait_for(lambda: {m.worker_id for m in client.source.router.members()} == {"worker-0", "worker-1"},
                 10, "the client to drop worker-2")
        time.sleep(3.5)  # the workers' own peer lookups (TTL 2 s + router refresh 1 s)
        gone = embedded["worker-2"].url
        asked = _data_requests(gone)
        before = stored_keys(module_home, NAME)["worker-2"]
        for path, data in contents.items():
            with client.open(path) as f:
                assert _sha(f.read()) == _sha(data), path
        assert _data_requests(gone) == asked
        assert stored_keys(module_home, NAME)["worker-2"] == before
        after = stored_keys(module_home, NAME)
        for key in cold_keys:
            assert key in after[owners(key, ["worker-0", "worker-1"])[0]], key
    finally:
        zone.hidden.clear()
        client.close()


def test_daemonset_targets_identified_by_healthz(dns_cluster, module_home):
    _plane, zone, _server, nameserver, _contents = dns_cluster
    zone.by_address, zone.glue = True, False
    try:
        members = DnsMembership(nameserver).live("default", NAME)
    finally:
        zone.by_address, zone.glue = False, True
    embedded = live(module_home, NAME)
    assert [(m.worker_id, m.url, m.node) for m in members] == [
        (w, embedded[w].url, f"10-0-0-{embedded[w].index}") for w in sorted(embedded)]


def test_no_ready_worker_reads_from_the_ufs(dns_cluster):
    """NXDOMAIN (no ready pod behind the Service) is an answer: no workers, reads go to the UFS."""
    plane, zone, _server, nameserver, contents = dns_cluster
    zone.hidden.update({"worker-0", "worker-1", "worker-2"})
    client = open_client(plane, NAME, short_circuit=False)
    try:
        assert DnsMembership(nameserver).live("default", NAME) == []
        assert client.source.router.members() == []
        with client.open("later/d.bin") as f:
            assert _sha(f.read()) == _sha(contents["later/d.bin"])
        router = Router(DnsMembership(nameserver), "default", NAME, strict=False)
        assert Peers("worker-0", router, WorkerClient("", NAME, BLOCK)).owns(f"{NAME}/x/0") is False
        router.close()
    finally:
        zone.hidden.clear()
        client.close()


def test_dns_down_keeps_last_answer_then_clear_error(dns_cluster, module_home):
    """Runs last in the module: it stops the DNS server."""
    plane, _zone, server, nameserver, contents = dns_cluster
    members = DnsMembership(nameserver, ttl_s=0.2, stale_s=5.0)
    first = members.live("default", NAME)
    assert [m.worker_id for m in first] == ["worker-0", "worker-1", "worker-2"]
    # how a worker sees its peers (worker.serve): a failed membership keeps the last list
    peers = Router(DnsMembership(nameserver, ttl_s=0.2, stale_s=5.0), "default", NAME, refresh_s=0.0, strict=False)
    assert peers.members() == first
    client = open_client(plane, NAME, short_circuit=False)
    try:
        client.source.router._membership.stale_s = 5.0  # the default (30 s) is too long for a test
        client.source.router.members()
        server.stop()
        server.server.server_close()  # the port is closed, as on a DNS pod that is gone
        stopped = time.monotonic()
        time.sleep(0.5)
        assert members.live("default", NAME) == first  # past the TTL, within the stale bound
        with client.open("a.bin") as f:
            assert _sha(f.read()) == _sha(contents["a.bin"])
        assert time.monotonic() - stopped < 5.0, "the stale answer was not kept long enough to check reads"
        time.sleep(max(0.0, stopped + 5.2 - time.monotonic()))
        with pytest.raises(MembershipUnavailableError) as err:
            members.live("default", NAME)
        message = str(err.value)
        assert srv_name("default", NAME) in message and "headless Service" in message, message
        assert "s old" in message and "\n" not in message
        with pytest.raises(MembershipUnavailableError):
            with client.open("b.bin") as f:
                f.read()
        assert peers.members() == first  # a worker's peers keep the workers they knew
    finally:
        client.close()
        peers.close()
