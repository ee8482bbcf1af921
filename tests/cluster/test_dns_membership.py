"""DNS membership (Kubernetes' headless Service) against a real DNS server on loopback.

A dnslib DNSServer answers, like Kubernetes DNS does for the headless Service ``dnsrt-worker``,
one SRV record per ready worker (``_http._tcp.dnsrt-worker.default.svc.cluster.local``) with its
target's A record in the additional section; its ready workers are the real worker processes
of a 3-worker runtime (their ports read from the embedded membership), started by the test as the
StatefulSet would (with DNS membership the plane starts none). Workers and clients are switched to
DNS membership by the environment the operator sets in pods. Checked: warmup + reads (sha256 of
bytes) with every block on its HRW owner, a worker removed from DNS no longer asked; "pods" (fresh
homes applying the operator's ConfigMap) running the DataLoad Job's command and ``datacache cat``
warm and read through the workers, caching nothing and starting no process themselves;
DaemonSet-style targets identified through /healthz, and a DNS server that goes down: the last
answer is kept for the stale bound, then a clear error.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
from dnslib import QTYPE, RCODE, RR, SRV, A
from dnslib.server import BaseResolver, DNSLogger, DNSServer
from prometheus_client.parser import text_string_to_metric_families

from cluster_support import (MiB, apply_cluster, block_bytes, live, open_client, processes_of, reap, runtime_docs,
                             stored_keys, wait_for, worker_metrics)
from datacache.api.loader import load_resource_dict, load_resources
from datacache.control import supervisor
from datacache.stack import readpath
from datacache.state import StateStore
from datacache.errors import ConfigError
from datacache.cluster.discovery import DnsMembership, MembershipUnavailableError, srv_name
from datacache.cluster.placement import owners
from datacache.cluster.worker_client import WorkerClient
from datacache.cluster.peers import Peers
from datacache.cluster.routing import Router
from datacache.warmup import warmup

NAME = "dnsrt"
BLOCK = 256 << 10
WARM = {"a.bin": 3 * BLOCK + 11, "b.bin": 2 * MiB + 5, "dir/c.bin": BLOCK}
COLD = {"later/d.bin": 6 * BLOCK + 1, "later/e.bin": 2 * MiB}
POD = {"job/f.bin": 5 * BLOCK + 3, "job/g.bin": 2 * BLOCK}  # warmed by a DataLoad Job "pod"
SERVICE = f"{NAME}-worker.default.svc.cluster.local."
TOKEN = "t" * 43  # the Secret's token, as the kubelet puts it in the pods' environment


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
    """``(plane, zone, server, nameserver, contents)``: 3 workers found through a real DNS server.

    As on Kubernetes, the plane only stores the resources (membership is external, so it starts no
    worker) and the "orchestrator" (this fixture, the StatefulSet's role) runs ``datacache worker
    serve --index i`` itself, with the environment the operator puts in every pod."""
    src = tmp_path_factory.mktemp("src")
    contents = {}
    for name, size in {**WARM, **COLD, **POD}.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data := bytes(range(256)) * (size // 256) + b"x" * (size % 256))
        contents[name] = data
    zone = HeadlessService(module_home)
    port = _free_udp_port()
    server = DNSServer(zone, port=port, address="127.0.0.1", logger=DNSLogger(logf=lambda _: None))
    server.start_thread()
    nameserver = f"127.0.0.1:{port}"
    logs = tmp_path_factory.mktemp("logs")
    workers = []
    with pytest.MonkeyPatch.context() as env:  # what the operator sets in every pod
        env.setenv("DATACACHE_MEMBERSHIP", "dns")
        env.setenv("DATACACHE_DNS_NAMESERVER", nameserver)
        env.setenv("DATACACHE_HOME", str(module_home))
        env.setenv("DATACACHE_WORKER_TOKEN", TOKEN)
        plane = apply_cluster(module_home, NAME, [{"name": "local", "mountPoint": str(src), "path": "/"}])
        try:
            assert live(module_home, NAME) == {}  # the plane started none: the orchestrator does
            for i in range(3):
                with open(logs / f"worker-{i}.log", "wb") as log:
                    workers.append(subprocess.Popen(
                        [sys.executable, "-m", "datacache", "worker", "serve", NAME, "-n", "default", "--home",
                         str(module_home), "--index", str(i), "--port", "0"], stdin=subprocess.DEVNULL,
                        stdout=log, stderr=subprocess.STDOUT))
            wait_for(lambda: len(live(module_home, NAME)) == 3, 60, "3 workers to register")
            yield plane, zone, server, nameserver, contents
        finally:
            plane.close()
            for proc in workers:  # before the DNS server goes: workers ask it until they stop
                proc.terminate()
            for proc in workers:
                proc.wait(30)
            reap(module_home)
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
        for path in {**WARM, **COLD}:  # POD's files stay cold for the DataLoad pod's test
            with client.open(path) as f:
                assert _sha(f.read()) == _sha(contents[path]), path
        assert _data_requests(gone) == asked
        assert stored_keys(module_home, NAME)["worker-2"] == before
        after = stored_keys(module_home, NAME)
        for key in cold_keys:
            assert key in after[owners(key, ["worker-0", "worker-1"])[0]], key
    finally:
        zone.hidden.clear()
        client.close()


def _pod(tmp_path, pod: str, plane, nameserver: str) -> tuple:
    """``(home, env, argv of the DataLoad Job's container)`` of a "pod": a fresh ``$DATACACHE_HOME``,
    the operator's ConfigMap (real replica count) at its config directory, the environment the
    operator sets (values from ``manifests.pod_env``; the token and the DNS server as the kubelet
    and the pod's resolv.conf would give them)."""
    from datacache_operator import manifests
    from datacache_operator.settings import CONFIG_DIR, Settings

    dataset, runtime = plane.get("Dataset", NAME), plane.get("CacheRuntime", NAME)
    owner = {"apiVersion": "datacache.io/v1alpha1", "kind": "CacheRuntime", "metadata": {"name": NAME, "uid": "u1"}}
    home, conf = tmp_path / pod / "home", tmp_path / pod / "config"
    home.mkdir(parents=True, mode=0o700)
    conf.mkdir()
    config = manifests.config_map(dataset, runtime, owner)["data"]["resources.yaml"]
    assert load_resources("resources.yaml", config)[1].spec.replicas == 3
    (conf / "resources.yaml").write_text(config)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DATACACHE_")}
    env.update({e["name"]: e["value"] for e in manifests.pod_env(runtime, Settings()) if "value" in e})
    assert env["DATACACHE_MEMBERSHIP"] == "dns"
    env.update(DATACACHE_HOME=str(home), DATACACHE_DNS_NAMESERVER=nameserver, DATACACHE_WORKER_TOKEN=TOKEN,
               PATH=f"{os.path.dirname(sys.executable)}:{env['PATH']}")
    dataload = load_resource_dict({"apiVersion": "datacache.io/v1alpha1", "kind": "DataLoad",
                                   "metadata": {"name": "warm-job", "namespace": "default"},
                                   "spec": {"dataset": {"name": NAME}, "target": [{"path": "/job"}]}}, "test")
    job = manifests.dataload_job(dataload, dataset, runtime, owner, Settings())
    argv = job["spec"]["template"]["spec"]["containers"][0]["command"]
    return home, env, [arg.replace(CONFIG_DIR, str(conf)) for arg in argv], conf / "resources.yaml"


def _sum_metrics(home) -> dict[str, float]:
    """Hits, misses and UFS bytes summed over the live workers' /metrics."""
    per_worker = worker_metrics(home, NAME)
    return {k: sum(m.get(k, 0.0) for m in per_worker.values())
            for k in ("datacache_worker_hits_total", "datacache_worker_misses_total", "datacache_worker_ufs_bytes_total")}


def test_pods_read_and_warm_through_the_workers(dns_cluster, module_home, tmp_path):
    """A DataLoad Job's pod and a training pod's FUSE sidecar, as the operator makes them: their
    embedded planes start no worker, warmup puts every block on its HRW owner's disk (none in the
    pod), and another pod's reads are worker hits (no UFS read) with the bytes' sha256 intact."""
    plane, _zone, _server, nameserver, contents = dns_cluster
    workers_before = {w: m.pid for w, m in live(module_home, NAME).items()}
    home, env, job, config = _pod(tmp_path, "dataload", plane, nameserver)
    done = subprocess.run(job, env=env, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-3000:]

    manifest = plane.load_manifest(plane.get("Dataset", NAME))
    keys = block_bytes([e for e in manifest if e.path in POD], BLOCK, NAME)
    assert len(keys) == 6 + 2
    stored, ids = stored_keys(module_home, NAME), sorted(workers_before)
    for key in keys:
        assert key in stored[owners(key, ids)[0]], key
    assert not (home / "cache").exists(), "the pod cached blocks in its own emptyDir"
    assert list(home.rglob("*.pid")) == [] and processes_of(home) == [], "the pod's plane started processes"
    assert live(home, NAME) == {} and {w: m.pid for w, m in live(module_home, NAME).items()} == workers_before
    state = StateStore(str(home))
    try:
        [record] = state.list("DataLoad", "default")  # datacache warmup's one-shot DataLoad
    finally:
        state.close()
    status = record["status"]
    assert status["phase"] == "Complete", status
    assert sum(w["bytes"] for w in status["workers"].values()) == sum(POD.values()) == sum(keys.values())

    # another pod (a FUSE sidecar's plane): fresh home, reads are served by the workers
    home_b, env_b, _job, config_b = _pod(tmp_path, "trainer", plane, nameserver)
    applied = subprocess.run(["datacache", "apply", "-f", str(config_b)], env=env_b, capture_output=True, timeout=60)
    assert applied.returncode == 0, applied.stderr.decode()
    before = _sum_metrics(module_home)
    for path in POD:
        read = subprocess.run(["datacache", "cat", f"{NAME}/{path}"], env=env_b, capture_output=True, timeout=60)
        assert read.returncode == 0, read.stderr.decode()
        assert _sha(read.stdout) == _sha(contents[path]), path
    after = _sum_metrics(module_home)
    assert after["datacache_worker_misses_total"] == before["datacache_worker_misses_total"]
    assert after["datacache_worker_ufs_bytes_total"] == before["datacache_worker_ufs_bytes_total"]
    assert after["datacache_worker_hits_total"] - before["datacache_worker_hits_total"] >= len(keys)
    assert not (home_b / "cache").exists() and list(home_b.rglob("*.pid")) == []

    # status in the pod: the workers DNS lists, each answering its /metrics
    got = subprocess.run(["datacache", "get", "runtimes", "-o", "json"], env=env_b, capture_output=True, timeout=60)
    assert got.returncode == 0, got.stderr.decode()
    runtime_status = json.loads(got.stdout)["items"][0]["status"]
    assert (runtime_status["desiredWorkers"], runtime_status["readyWorkers"]) == (3, 3), runtime_status
    assert processes_of(home_b) == []


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
    stale_s = 8.0  # the default (30 s) is too long for a test; room for a read on a loaded machine
    members = DnsMembership(nameserver, ttl_s=0.2, stale_s=stale_s)
    first = members.live("default", NAME)
    assert [m.worker_id for m in first] == ["worker-0", "worker-1", "worker-2"]
    # how a worker sees its peers (worker.serve): a failed membership keeps the last list
    peers = Router(DnsMembership(nameserver, ttl_s=0.2, stale_s=stale_s), "default", NAME, refresh_s=0.0, strict=False)
    assert peers.members() == first
    client = open_client(plane, NAME, short_circuit=False)
    try:
        client.source.router._membership.stale_s = stale_s
        client.source.router.members()
        server.stop()
        server.server.server_close()  # the port is closed, as on a DNS pod that is gone
        stopped = time.monotonic()
        time.sleep(0.5)
        assert members.live("default", NAME) == first  # past the TTL, within the stale bound
        with client.open("a.bin") as f:
            assert _sha(f.read()) == _sha(contents["a.bin"])
        assert time.monotonic() - stopped < stale_s, "the stale answer was not kept long enough to check reads"
        time.sleep(max(0.0, stopped + stale_s + 0.2 - time.monotonic()))
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


def test_unknown_membership_kind_is_a_clear_error(monkeypatch):
    """The one predicate: replicas >= 1 reads through external workers; a typo is a one-line error."""
    _dataset, runtime = runtime_docs(NAME, [{"name": "local", "mountPoint": "/data"}],
                                     [{"mediumtype": "SSD", "path": "cache", "quota": "1Mi"}], 1, "256Ki")
    monkeypatch.setenv("DATACACHE_MEMBERSHIP", "dns")
    assert supervisor.external_workers() and readpath.distributed(runtime)
    monkeypatch.setenv("DATACACHE_MEMBERSHIP", "embedded")
    assert not supervisor.external_workers() and not readpath.distributed(runtime)
    monkeypatch.setenv("DATACACHE_MEMBERSHIP", "k8s")
    with pytest.raises(ConfigError) as err:
        readpath.distributed(runtime)
    assert str(err.value) == "environment: DATACACHE_MEMBERSHIP: 'k8s' is not a membership kind (set embedded or dns)"
