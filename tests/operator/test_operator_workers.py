"""The worker pod's own command, run on loopback (one address per "pod"), feeds the real operator:
it scrapes the workers' /metrics for the runtime's status and applies the autoscale policy to
``spec.replicas``, which the StatefulSet follows. Kubernetes is kmock; the workers are real."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families
import pytest
import yaml

from datacache.api.loader import load_resources
from datacache.api.quantity import format_bytes
from datacache.cache.disk import DiskTier
from datacache.cache.memory import MemoryTier
from datacache.cache.tiered import TieredStore
from datacache.cluster.metrics import WorkerMetrics as MetricsPage
from datacache.control import reconcile
from datacache_operator import manifests, worker_reports
from datacache_operator.settings import CONFIG_DIR, Settings
from test_operator_kmock import NS, UID, _get, _wait, cluster, run_operator  # noqa: F401  (the fixture)

QUOTA = 64 * 1024**2


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_worker(pod_command, conf_dir, home, ordinal, token, blocked=False):
    """Run the StatefulSet container's command for pod ``imagenet-worker-<ordinal>``, listening
    on 127.0.0.<ordinal + 2> instead of 0.0.0.0 (all pods share one port). ``blocked``: its tier
    directory cannot be made (a file is in the way), as on a disk it may not write."""
    script = pod_command[2].replace(CONFIG_DIR, str(conf_dir)).replace("--host 0.0.0.0", f"--host 127.0.0.{ordinal + 2}")
    # the operator's pod environment (DNS membership: the pod's plane starts no workers of its own);
    # no DNS server here, so a closed loopback port: peer lookups fail fast and find no peers
    env = dict(os.environ, DATACACHE_HOME=str(home), DATACACHE_WORKER_TOKEN=token, DATACACHE_MEMBERSHIP="dns",
               DATACACHE_DNS_NAMESERVER=f"127.0.0.1:{_free_port()}",
               POD_NAME=f"imagenet-worker-{ordinal}", PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
    home.mkdir(mode=0o700)
    if blocked:
        (home / "cache").write_bytes(b"")
    return subprocess.Popen(["sh", "-c", script], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _metrics(url):
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=2) as resp:
            return resp.read().decode()
    except OSError:
        return ""


@pytest.fixture
def workers(tmp_path, request):
    """Two real worker processes started from the generated pod spec; yields (resources, port,
    processes). Indirect parameter: the ordinals whose tier cannot be written."""
    blocked = getattr(request, "param", ())
    data = tmp_path / "data"
    (data / "train").mkdir(parents=True)
    (data / "train" / "a.bin").write_bytes(os.urandom(300_000))
    port = _free_port()
    text = f"""
apiVersion: datacache.io/v1alpha1
kind: Dataset
metadata: {{name: imagenet, namespace: {NS}}}
spec:
  mounts: [{{name: local, mountPoint: {data}}}]
---
apiVersion: datacache.io/v1alpha1
kind: CacheRuntime
metadata: {{name: imagenet, namespace: {NS}}}
spec:
  replicas: 3
  worker: {{port: {port}}}
  tieredstore: {{levels: [{{mediumtype: SSD, path: cache, quota: {QUOTA}}}]}}
  autoscale: {{minReplicas: 1, maxReplicas: 4, scaleDown: Gated, cooldown: 0}}
"""
    dataset, runtime = load_resources("workers.yaml", text)
    owner = {"apiVersion": "datacache.io/v1alpha1", "kind": "CacheRuntime",
             "metadata": {"name": "imagenet", "uid": UID["CacheRuntime"]}}
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "resources.yaml").write_text(manifests.config_map(dataset, runtime, owner)["data"]["resources.yaml"])
    command = manifests.worker_workload(dataset, runtime, owner, Settings())["spec"]["template"]["spec"]["containers"][0]["command"]
    procs = [_start_worker(command, conf, tmp_path / f"home-{i}", i, "tok-" + "x" * 40, i in blocked) for i in range(2)]
    try:
        for i, proc in enumerate(procs):
            url = f"http://127.0.0.{i + 2}:{port}"
            deadline = time.monotonic() + 60
            while "datacache_worker_total_capacity_bytes" not in _metrics(url):
                assert proc.poll() is None, f"worker {i} exited: {proc.stderr.read().decode()[-2000:]}"
                assert time.monotonic() < deadline, f"worker {i} did not answer on {url}"
                time.sleep(0.2)
        yield yaml.safe_load_all(text), port, procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=20)


def test_status_from_worker_metrics_and_autoscale(cluster, workers, monkeypatch):  # noqa: F811
    kmock, portal = cluster
    docs, port, worker_procs = workers
    crs = "datacache.io/v1alpha1"
    _objects(kmock, docs)
    monkeypatch.setenv("DATACACHE_STATUS_INTERVAL_S", "0.5")
    seen = []
    with run_operator() as runner:
        def status_from_workers():
            """the runtime's status counting both workers"""
            status = _get(kmock, f"{crs}/cacheruntimes", "imagenet").get("status", {})
            seen.append(status)
            return status.get("readyWorkers") == 2 and status
        status = _wait(status_from_workers, timeout=60)
        assert status["cacheCapacity"] == format_bytes(2 * QUOTA)  # Σ the workers' reported quotas
        assert [(c["type"], c["status"]) for c in status["conditions"]] == [("Ready", "False"), ("CacheTiersHealthy", "True")]
        assert sorted(w["name"] for w in status["workers"]) == ["imagenet-worker-0", "imagenet-worker-1"]
        for i, worker in enumerate(sorted(status["workers"], key=lambda w: w["name"])):
            # the figures each worker reports itself (used: the store's index, no block yet)
            text = _metrics(f"http://127.0.0.{i + 2}:{port}")
            reported = {f.name: f.samples[0].value for f in text_string_to_metric_families(text) if f.samples}
            assert worker["capacity"] == QUOTA == reported["datacache_worker_total_capacity_bytes"]
            assert worker["used"] == reported["datacache_worker_used_bytes"] < 1024**2
        # nothing is cached: with scaleDown Gated and cooldown 0 the policy scales in to minReplicas
        _wait(lambda: _get(kmock, f"{crs}/cacheruntimes", "imagenet")["spec"]["replicas"] == 1, timeout=60)
        _wait(lambda: _get(kmock, "apps/v1/statefulsets", "imagenet-worker")["spec"]["replicas"] == 1, timeout=60)
        # the StatefulSet controller removes pod 1: the refreshed status counts one worker
        os.killpg(worker_procs[1].pid, signal.SIGTERM)
        portal.call(kmock.delete, f"/api/v1/namespaces/{NS}/pods/imagenet-worker-1")

        def settled():
            """the runtime Ready with one worker"""
            status = _get(kmock, f"{crs}/cacheruntimes", "imagenet").get("status", {})
            return (status.get("phase"), status.get("readyWorkers"), status.get("desiredWorkers")) == ("Ready", 1, 1) and status
        assert _wait(settled, timeout=60)["cacheCapacity"] == format_bytes(QUOTA)
    assert runner.exception is None
    posted = [r.data for r in kmock[kmock.resource("v1/events")] if r.method == "POST"]
    messages = [e["message"] for e in posted if e.get("reason") == "Scaled"]
    assert any(m.endswith("scaling in from 3 to 2") for m in messages), messages
    assert any(s.get("phase") == "PartialReady" and s.get("desiredWorkers") == 3 for s in seen)


def _objects(kmock, docs):
    """The Dataset and CacheRuntime ``docs`` as applied, and the two worker pods the StatefulSet
    controller and kubelet would have made."""
    for doc in docs:
        plural = {"Dataset": "datasets", "CacheRuntime": "cacheruntimes"}[doc["kind"]]
        doc["metadata"].update(uid=UID[doc["kind"]], resourceVersion="1")
        kmock.objects[f"datacache.io/v1alpha1/{plural}", NS, "imagenet"] = doc
    for i in range(2):
        kmock.objects["v1/pods", NS, f"imagenet-worker-{i}"] = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"imagenet-worker-{i}", "namespace": NS, "uid": f"pod-{i}",
                         "labels": {"app.kubernetes.io/name": "datacache", "app.kubernetes.io/component": "worker",
                                    "datacache.io/runtime": "imagenet"}},
            "spec": {"containers": [{"name": "worker", "image": "datacache:test"}]},
            "status": {"phase": "Running", "podIP": f"127.0.0.{i + 2}"}}


@pytest.mark.parametrize("workers", [(1,)], indirect=True)
def test_unhealthy_tier_is_a_runtime_condition(cluster, workers, tmp_path, monkeypatch):  # noqa: F811
    """Worker 1 cannot make its tier directory: it serves from the UFS, and the runtime's
    CacheTiersHealthy condition says so, naming the worker and the directory (from its /metrics)."""
    kmock, _ = cluster
    docs, port, _ = workers
    crs = "datacache.io/v1alpha1"
    _objects(kmock, docs)
    monkeypatch.setenv("DATACACHE_STATUS_INTERVAL_S", "0.5")
    with run_operator() as runner:
        status = _wait(lambda: (s := _get(kmock, f"{crs}/cacheruntimes", "imagenet").get("status", {})).get(
            "readyWorkers") == 2 and s, timeout=60)
    assert runner.exception is None
    blocked_dir = f"{tmp_path}/home-1/cache/{NS}/imagenet/worker-1"
    ready, tiers = status["conditions"]
    assert (ready["type"], tiers["type"], tiers["status"], tiers["reason"]) == (
        "Ready", "CacheTiersHealthy", "False", "TierUnhealthy")
    assert tiers["message"] == (
        "cache tier cannot be written, the blocks it would hold are read from the UFS: "
        f"worker imagenet-worker-1: SSD tier {blocked_dir}: make the directory writable by the worker's uid "
        "(README: cache directories on the node)")
    entries = {w["name"]: w["unhealthyTiers"] for w in status["workers"]}
    assert entries == {"imagenet-worker-0": [], "imagenet-worker-1": [{"medium": "SSD", "path": blocked_dir}]}
    # what worker 1 exports itself
    assert f'datacache_worker_tier_healthy{{medium="SSD",path="{blocked_dir}"}} 0.0' in _metrics(f"http://127.0.0.3:{port}")


def test_runtime_status_from_tier_gauges(tmp_path):
    """reconcile.runtime_status on the entries made from two workers' metrics pages (real tiered
    stores: one tier directory cannot be made): the CacheTiersHealthy condition is False and names
    that worker and directory only; with healthy tiers it is True; without tier reports absent."""
    (tmp_path / "file").write_bytes(b"")
    pages = {}
    for name, path in (("w-0", tmp_path / "ok"), ("w-1", tmp_path / "file" / "tier")):
        store = TieredStore([MemoryTier(1 << 20), DiskTier(str(path), 1 << 20, medium="HDD")])
        worker = SimpleNamespace(store=store, source=SimpleNamespace(ufs_bytes=0), peer_bytes=0)
        pages[name] = MetricsPage(worker).render().decode()
        store.close()
    entries = [worker_reports.status_entry(worker_reports.parse(text, name)) for name, text in pages.items()]
    assert [e["unhealthyTiers"] for e in entries] == [[], [{"medium": "HDD", "path": str(tmp_path / "file" / "tier")}]]
    status = reconcile.runtime_status(2, entries)
    assert status["phase"] == "Ready" and status["conditions"][0]["type"] == "Ready"
    tiers = status["conditions"][1]
    assert (tiers["type"], tiers["status"], tiers["reason"]) == ("CacheTiersHealthy", "False", "TierUnhealthy")
    assert f"worker w-1: HDD tier {tmp_path / 'file' / 'tier'}:" in tiers["message"] and "w-0" not in tiers["message"]
    assert reconcile.runtime_status(1, entries[:1])["conditions"][1]["status"] == "True"
    assert [c["type"] for c in reconcile.runtime_status(1, [{"ready": True}])["conditions"]] == ["Ready"]
