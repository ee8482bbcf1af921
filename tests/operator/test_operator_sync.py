"""A Dataset's metadata sync on Kubernetes.

1. The real operator (KopfRunner) against kmock: a bound Dataset gets its sync Job, ServiceAccount,
   RoleBinding and manifest claim (all valid, owned by the Dataset); its phase follows the Job
   (Updating, Failed saying where the logs are, Bound once a sync reported); a failed or old sync
   is re-run after ``autoSyncInterval``.
2. The sync Job's own command, run as its pod would run it: moto S3 over HTTP as the UFS (the
   credentials only as files, where the Secret volume puts them), two real cache workers started
   with the worker pod's command, a dnslib server answering as the workers' headless Service, a
   DataLoad Job's command warming ``/train`` through them, and kmock as the API server. The
   Dataset's status in kmock gets ufsTotal, fileNum, cached and cachedPercentage equal to the
   bytes in S3 and the bytes of current-version blocks on the workers; a second run (a fresh pod,
   the same claim) diffs against the first run's manifest and marks only the OnEvent DataLoad
   whose targets changed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timezone

import pytest
from dnslib import QTYPE, RCODE, RR, SRV, A
from dnslib.server import BaseResolver, DNSLogger, DNSServer
from click.testing import CliRunner

from datacache.api.loader import load_resources
from datacache.api.quantity import format_bytes
from datacache.cli import cli
from datacache.cluster.discovery import srv_name
from datacache.control.reconcile import percentage
from datacache_operator import manifests, syncjob
from datacache_operator.settings import CONFIG_DIR, HOME, Settings
from operator_schemas import validate
from test_chart import _render
from test_operator_kmock import NS, UID, _get, _resource, _wait, cluster, run_operator  # noqa: F401  (the fixture)
from test_operator_workers import _free_port, _metrics, _start_worker

CRS = "datacache.io/v1alpha1"
BLOCK = 256 << 10
QUOTA = 64 << 20
TOKEN = "tok-" + "x" * 40
FILES = {"train/a.bin": 3 * BLOCK + 11, "train/b.bin": BLOCK + 5, "val/c.bin": 2 * BLOCK}


def _api_patch(kmock, path, body):
    """A merge patch through the API (so the operator's watch sees it), as another client makes it."""
    request = urllib.request.Request(f"{kmock.url}{path}", method="PATCH", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/merge-patch+json"})
    urllib.request.urlopen(request, timeout=10).close()


def _rbac_calls(kmock):
    """``(verb, resource)`` of every request kmock served, as RBAC names them."""
    calls = set()
    for request in kmock:
        path = request.url.path.split("/")
        if "namespaces" not in path:
            continue  # discovery (/api, /apis): allowed to every authenticated client
        rest = path[path.index("namespaces") + 2:]
        method = getattr(request.method, "value", request.method)
        verb = {"GET": "get" if len(rest) > 1 else "list", "PATCH": "patch", "POST": "create"}[method]
        calls.add((verb, "/".join(rest[:1] + rest[2:])))
    return calls


def _iso(epoch):
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# Seconds between a failed sync Job and its rerun: long enough that a loaded machine's operator still
# shows the Failed phase before the rerun replaces it (with 2 s, CI once saw only the rerun).
SYNC_INTERVAL_S = 5


def test_bound_dataset_gets_its_sync_job_and_follows_it(cluster, monkeypatch):  # noqa: F811
    kmock, _ = cluster
    monkeypatch.setenv("DATACACHE_STATUS_INTERVAL_S", "0.5")
    monkeypatch.setenv("DATACACHE_SYNC_STORAGE_CLASS", "fast-ssd")
    kmock.objects[f"{CRS}/datasets", NS, "imagenet"] = _resource("Dataset", "imagenet", {
        "autoSyncInterval": SYNC_INTERVAL_S,
        "mounts": [{"name": "s3", "mountPoint": "s3://bucket/imagenet", "encryptOptions": [
            {"name": "secret", "valueFrom": {"secretKeyRef": {"name": "s3-creds", "key": "secret-key"}}}]}]})
    kmock.objects[f"{CRS}/cacheruntimes", NS, "imagenet"] = _resource("CacheRuntime", "imagenet", {
        "replicas": 1, "tieredstore": {"levels": [{"mediumtype": "SSD", "path": "cache", "quota": "1Gi"}]}})
    with run_operator() as runner:
        job = _wait(lambda: _get(kmock, "batch/v1/jobs", "imagenet-sync"))
        children = [job, _get(kmock, "v1/persistentvolumeclaims", "imagenet-metadata"),
                    _get(kmock, "v1/serviceaccounts", "imagenet-sync"),
                    _get(kmock, "rbac.authorization.k8s.io/v1/rolebindings", "imagenet-sync")]
        for child in children:
            validate(child)
            assert child["metadata"]["ownerReferences"][0]["uid"] == UID["Dataset"]
        assert children[1]["spec"]["storageClassName"] == "fast-ssd"
        assert children[3]["roleRef"]["name"] == "datacache-sync"
        pod = job["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "imagenet-sync"
        assert {v["name"]: v for v in pod["volumes"]}["metadata"]["persistentVolumeClaim"] == {"claimName": "imagenet-metadata"}
        (container,) = pod["containers"]
        assert container["image"] == "datacache:test"
        assert container["command"][2] == ("exec datacache sync imagenet -n ml -f /etc/datacache/resources.yaml "
                                           "--report-status kubernetes")
        assert {"name": "secret-0", "mountPath": f"{HOME}/secrets/s3-creds", "readOnly": True} in container["volumeMounts"]

        def dataset(phase, reason):
            def check():
                """the Dataset's phase and condition"""
                status = _get(kmock, f"{CRS}/datasets", "imagenet").get("status", {})
                cond = (status.get("conditions") or [{}])[0]
                return (status.get("phase"), cond.get("reason")) == (phase, reason) and cond
            return check
        _wait(dataset("Pending", "NotSynced"))
        kmock.objects["batch/v1/jobs", NS, "imagenet-sync"].patch({"status": {"active": 1}})
        _wait(dataset("Updating", "Syncing"))
        now = time.time()
        kmock.objects["batch/v1/jobs", NS, "imagenet-sync"].patch({"status": {"active": 0, "failed": 4, "conditions": [
            {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "lastTransitionTime": _iso(now)}]}})
        cond = _wait(dataset("Failed", "SyncFailed"))
        assert cond["message"] == "metadata sync Job ml/imagenet-sync failed: see kubectl logs -n ml job/imagenet-sync"

        def rerun():
            """a new sync Job, autoSyncInterval after the failed one"""
            return not _get(kmock, "batch/v1/jobs", "imagenet-sync").get("status")
        _wait(rerun, timeout=30)
        assert time.time() - now >= SYNC_INTERVAL_S - 1  # not before the interval (RFC 3339 times: whole seconds)

        # the sync pod reports the figures and the Job completes: Bound, the figures kept
        _api_patch(kmock, f"/apis/{CRS}/namespaces/{NS}/datasets/imagenet/status",
                   {"status": {"ufsTotal": "3.00MiB", "fileNum": 3, "cacheStates": {"cached": "0B"}}})
        kmock.objects["batch/v1/jobs", NS, "imagenet-sync"].patch({"status": {"succeeded": 1, "completionTime": _iso(time.time()),
                                                                            "conditions": [{"type": "Complete", "status": "True"}]}})
        _wait(dataset("Bound", "Bound"))
        status = _get(kmock, f"{CRS}/datasets", "imagenet")["status"]
        assert (status["ufsTotal"], status["fileNum"]) == ("3.00MiB", 3)
    assert runner.exception is None
    assert "Traceback" not in runner.output


class HeadlessService(BaseResolver):
    """Kubernetes DNS for the headless Service ``imagenet-worker``: one SRV record per worker
    ``imagenet-worker-<i>`` on 127.0.0.<i + 2>:``port``, its A record in the additional section."""

    def __init__(self, port, workers):
        self.port, self.workers = port, workers

    def resolve(self, request, handler):
        reply, q = request.reply(), request.q
        if str(q.qname) == srv_name(NS, "imagenet") and q.qtype == QTYPE.SRV:
            for i in range(self.workers):
                target = f"imagenet-worker-{i}.imagenet-worker.{NS}.svc.cluster.local."
                reply.add_answer(RR(q.qname, QTYPE.SRV, ttl=5, rdata=SRV(0, 100, self.port, target)))
                reply.add_ar(RR(target, QTYPE.A, ttl=5, rdata=A(f"127.0.0.{i + 2}")))
        else:
            reply.header.rcode = RCODE.NXDOMAIN
        return reply


@pytest.fixture
def s3_dataset(tmp_path, moto_server, s3_bucket, monkeypatch):
    """The Dataset (moto S3, secret ``moto`` as files) and its CacheRuntime (2 workers) as the
    operator's ConfigMap holds them; returns (dataset, runtime, config dir, worker port, s3fs, bucket)."""
    fs, bucket = s3_bucket
    for path, size in FILES.items():
        fs.pipe(f"{bucket}/{path}", os.urandom(size))
    port = _free_port()
    text = f"""
apiVersion: {CRS}
kind: Dataset
metadata: {{name: imagenet, namespace: {NS}}}
spec:
  mounts:
    - name: s3
      mountPoint: s3://{bucket}
      options: {{endpoint_url: "{moto_server.endpoint_url}"}}
      encryptOptions:
        - {{name: key, valueFrom: {{secretKeyRef: {{name: moto, key: key}}}}}}
        - {{name: secret, valueFrom: {{secretKeyRef: {{name: moto, key: secret}}}}}}
---
apiVersion: {CRS}
kind: CacheRuntime
metadata: {{name: imagenet, namespace: {NS}}}
spec:
  replicas: 2
  blockSize: {BLOCK}
  worker: {{port: {port}}}
  tieredstore: {{levels: [{{mediumtype: SSD, path: cache, quota: {QUOTA}}}]}}
"""
    dataset, runtime = load_resources("imagenet.yaml", text)
    conf = tmp_path / "conf"
    conf.mkdir()
    owner = {"apiVersion": CRS, "kind": "CacheRuntime", "metadata": {"name": "imagenet", "uid": UID["CacheRuntime"]}}
    (conf / "resources.yaml").write_text(manifests.config_map(dataset, runtime, owner)["data"]["resources.yaml"])
    # the workers get the credentials by environment (_start_worker passes it on; the other pods get files)
    monkeypatch.setenv("DATACACHE_SECRET_MOTO_KEY", "testing")
    monkeypatch.setenv("DATACACHE_SECRET_MOTO_SECRET", "testing")
    return dataset, runtime, conf, port, fs, bucket


def _pod_env(home, dns_port, **extra):
    """A datacache pod's environment (pod_env as the kubelet resolves it), with DNS at ``dns_port``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DATACACHE_")}
    return dict(env, DATACACHE_HOME=str(home), DATACACHE_MEMBERSHIP="dns", DATACACHE_WORKER_TOKEN=TOKEN,
                DATACACHE_DNS_NAMESERVER=f"127.0.0.1:{dns_port}", KUBECONFIG=os.environ["KUBECONFIG"],
                PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}", **extra)


def _run_pod(job, conf, home, dns_port):
    """Run a Job's container command as its pod would, in a fresh ``home``; returns its stdout."""
    script = job["spec"]["template"]["spec"]["containers"][0]["command"][2].replace(CONFIG_DIR, str(conf))
    done = subprocess.run(["sh", "-c", script], env=_pod_env(home, dns_port), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and TOKEN not in done.stdout + done.stderr
    return done.stdout


def _pod_home(tmp_path, pod, claim=None):
    """A fresh pod's ``$DATACACHE_HOME``: the Secret ``moto`` as files (0400, what the Secret volume
    holds) and a sync pod's ``claim`` at ``datasets/<namespace>`` (a symlink standing for the
    volume mount)."""
    home = tmp_path / pod
    (home / "secrets" / "moto").mkdir(parents=True)
    for key in ("key", "secret"):
        (home / "secrets" / "moto" / key).write_text("testing")
        (home / "secrets" / "moto" / key).chmod(0o400)
    if claim is not None:
        (home / "datasets").mkdir()
        (home / "datasets" / NS).symlink_to(claim, target_is_directory=True)
    home.chmod(0o700)
    return home


def test_sync_job_reports_status_and_marks_on_event_dataloads(cluster, s3_dataset, tmp_path):  # noqa: F811
    kmock, _ = cluster
    dataset, runtime, conf, port, fs, bucket = s3_dataset
    kmock.objects[f"{CRS}/datasets", NS, "imagenet"] = _resource("Dataset", "imagenet", {
        "mounts": [{"name": "s3", "mountPoint": f"s3://{bucket}"}]})
    for name, target, uid in (("on-train", "/train", "a"), ("on-val", "/val", "b"), ("on-test", "/test", "c")):
        kmock.objects[f"{CRS}/dataloads", NS, name] = _resource("DataLoad", name, {
            "dataset": {"name": "imagenet", "namespace": NS}, "target": [{"path": target}], "policy": "OnEvent"},
            uid=f"33333333-0000-0000-0000-00000000000{uid}")
    command = manifests.worker_workload(dataset, runtime, {"apiVersion": CRS, "kind": "CacheRuntime", "metadata": {
        "name": "imagenet", "uid": UID["CacheRuntime"]}}, Settings())["spec"]["template"]["spec"]["containers"][0]["command"]
    dns = DNSServer(HeadlessService(port, 2), port=_free_port(), address="127.0.0.1", logger=DNSLogger("-", lambda _: None))
    dns.start_thread()
    workers = [_start_worker(command, conf, tmp_path / f"worker-{i}", i, TOKEN) for i in range(2)]
    try:
        for i, proc in enumerate(workers):
            deadline = time.monotonic() + 60
            while "datacache_worker_total_capacity_bytes" not in _metrics(f"http://127.0.0.{i + 2}:{port}"):
                assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
                assert time.monotonic() < deadline
                time.sleep(0.2)
        # a DataLoad Job's pod warms /train through the workers (DNS membership)
        warm = load_resources("dl.yaml", f"""
apiVersion: {CRS}
kind: DataLoad
metadata: {{name: warm, namespace: {NS}}}
spec: {{dataset: {{name: imagenet, namespace: {NS}}}, target: [{{path: /train}}]}}
""")[0]
        owner = {"apiVersion": CRS, "kind": "Dataset", "metadata": {"name": "imagenet", "uid": UID["Dataset"]}}
        _run_pod(manifests.dataload_job(warm, dataset, runtime, owner, Settings()), conf, _pod_home(tmp_path, "warm-home"),
                 dns.server.server_address[1])
        job = syncjob.sync_job(dataset, runtime, owner, Settings(), 1)
        claim = tmp_path / "claim"
        claim.mkdir()

        out = _run_pod(job, conf, _pod_home(tmp_path, "sync-home-1", claim), dns.server.server_address[1])
        assert "dataset.datacache.io/imagenet synced: 3 added, 0 changed, 0 deleted" in out
        status = _get(kmock, f"{CRS}/datasets", "imagenet")["status"]
        total, train = sum(FILES.values()), FILES["train/a.bin"] + FILES["train/b.bin"]
        assert (status["ufsTotal"], status["fileNum"]) == (format_bytes(total), 3)
        assert status["cacheStates"] == {
            "cached": format_bytes(train), "cachedPercentage": percentage(train, total),
            "cacheCapacity": format_bytes(2 * QUOTA), "cacheHitRatio": status["cacheStates"]["cacheHitRatio"],
            "lastTraceCached": "-"}  # no run recorded
        assert status["cacheStates"]["cacheHitRatio"] == "0.0%"  # warmup fills are misses, nothing was read
        # the first sync adds every file: the DataLoads whose targets hold files are marked
        marks = {n: _get(kmock, f"{CRS}/dataloads", n)["metadata"].get("annotations", {}).get("datacache.io/sync-event")
                 for n in ("on-train", "on-val", "on-test")}
        assert marks["on-train"] and marks["on-val"] and marks["on-test"] is None
        assert os.stat(claim / "imagenet").st_mode & 0o777 == 0o700
        assert (claim / "imagenet" / "manifest.parquet").exists()

        # train/a.bin is overwritten in S3: its cached blocks are an old version's and stop counting
        fs.pipe(f"{bucket}/train/a.bin", os.urandom(FILES["train/a.bin"]))
        time.sleep(1.1)  # the next sync's mark is a later second
        out = _run_pod(job, conf, _pod_home(tmp_path, "sync-home-2", claim), dns.server.server_address[1])
        assert "synced: 0 added, 1 changed, 0 deleted" in out
        assert "dataload.datacache.io/on-train marked" in out and "on-val" not in out
        status = _get(kmock, f"{CRS}/datasets", "imagenet")["status"]
        assert status["cacheStates"]["cached"] == format_bytes(FILES["train/b.bin"])
        assert status["cacheStates"]["cachedPercentage"] == percentage(FILES["train/b.bin"], total)
        again = {n: _get(kmock, f"{CRS}/dataloads", n)["metadata"]["annotations"]["datacache.io/sync-event"]
                 for n in ("on-train", "on-val")}
        assert again["on-val"] == marks["on-val"] and again["on-train"] > marks["on-train"]
        # every API call the pods made is one the chart's sync ClusterRole grants (and it grants no more)
        rules = next(o for o in _render({}) if o["metadata"]["name"] == "dc-datacache-sync")["rules"]
        granted = {(verb, res) for rule in rules for res in rule["resources"] for verb in rule["verbs"]}
        assert _rbac_calls(kmock) == granted - {("get", "datasets/status"), ("get", "dataloads")}
    finally:
        dns.stop()
        for proc in workers:
            if proc.poll() is None:
                os.killpg(proc.pid, 15)
        for proc in workers:
            proc.wait(timeout=20)


def test_report_errors_are_one_line(cluster, tmp_path, monkeypatch):  # noqa: F811
    """No API access, or a Dataset the cluster does not have: one ``error:`` line naming the
    flag, the call and the fix; the sync itself has run (its manifest is stored)."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.bin").write_bytes(b"x" * 1000)
    resources = tmp_path / "ds.yaml"
    resources.write_text(f"""
apiVersion: {CRS}
kind: Dataset
metadata: {{name: local, namespace: {NS}}}
spec: {{mounts: [{{name: d, mountPoint: "{tmp_path / 'data'}"}}]}}
""")
    args = ["sync", "local", "-n", NS, "-f", str(resources), "--report-status", "kubernetes", "--home", str(tmp_path / "h")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == ("error: --report-status kubernetes: patch dataset ml/local status: "
                                              "HTTP 404: not found in the cluster")
    assert (tmp_path / "h" / "datasets" / NS / "local" / "manifest.parquet").exists()
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nosuch"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1 and "Traceback" not in result.output
    last = result.output.splitlines()[-1]
    assert last.startswith("error: --report-status kubernetes: no Kubernetes API access (") and last.endswith(
        "): run it in the operator's sync Job (its ServiceAccount) or set KUBECONFIG")
