"""Every object the operator generates is valid for a current Kubernetes release, and carries
what the runtime needs (tiered-store volumes, owner, token by reference, secrets as files)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest
import yaml

from datacache.api.loader import load_resources
from datacache.api.models import DataLoadTarget
from datacache.cluster.discovery import ordinal_worker_id, srv_name
from datacache_operator import manifests
from datacache_operator.settings import HOME, Settings

from operator_schemas import validate

RESOURCES = """
apiVersion: datacache.io/v1alpha1
kind: Dataset
metadata: {name: imagenet, namespace: ml}
spec:
  mounts:
    - name: s3
      mountPoint: s3://bucket/imagenet
      options: {endpoint_url: "https://s3.example.com"}
      encryptOptions:
        - {name: key, valueFrom: {secretKeyRef: {name: s3-creds, key: access-key}}}
        - {name: secret, valueFrom: {secretKeyRef: {name: s3-creds, key: secret-key}}}
    - name: labels
      mountPoint: /nfs/labels
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms: [{matchExpressions: [{key: gpu, operator: Exists}]}]
---
apiVersion: datacache.io/v1alpha1
kind: CacheRuntime
metadata: {name: imagenet, namespace: ml}
spec:
  replicas: 3
  tieredstore:
    levels:
      - {mediumtype: MEM, quota: 2Gi}
      - {mediumtype: SSD, path: /mnt/nvme/datacache, quota: 500Gi}
      - {mediumtype: HDD, path: cache/hdd, quota: 1Ti}
---
apiVersion: datacache.io/v1alpha1
kind: DataLoad
metadata: {name: warm, namespace: ml}
spec:
  dataset: {name: imagenet, namespace: ml}
  target: [{path: /s3/train}, {path: "/labels/*.csv"}]
"""


def _owner(resource, uid="0b9c4e2a-1111-2222-3333-444455556666"):
    return {"apiVersion": "datacache.io/v1alpha1", "kind": resource.kind,
            "metadata": {"name": resource.metadata.name, "namespace": resource.metadata.namespace, "uid": uid}}


def _load():
    return load_resources("k8s.yaml", RESOURCES)


def _all(settings):
    dataset, runtime, dataload = _load()
    owner = _owner(runtime)
    return [
        manifests.config_map(dataset, runtime, owner),
        manifests.token_secret(runtime, "t0ken", owner),
        manifests.headless_service(runtime, owner),
        manifests.worker_workload(dataset, runtime, owner, settings),
        manifests.dataload_job(dataload, dataset, runtime, _owner(dataload), settings),
    ]


def test_every_generated_object_is_valid_and_owned():
    for kind in ("StatefulSet", "DaemonSet"):
        for obj in _all(Settings(worker_kind=kind)):
            validate(obj)
            (ref,) = obj["metadata"]["ownerReferences"]
            assert ref["uid"] == "0b9c4e2a-1111-2222-3333-444455556666" and ref["controller"] is True


def test_worker_statefulset_volumes_and_command():
    dataset, runtime, _ = _load()
    sts = manifests.worker_workload(dataset, runtime, _owner(runtime), Settings(image="img:1"))
    assert sts["kind"] == "StatefulSet" and sts["spec"]["replicas"] == 3
    assert sts["spec"]["serviceName"] == "imagenet-worker"
    pod = sts["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["cache-ssd"]["hostPath"] == {"path": "/mnt/nvme/datacache", "type": "DirectoryOrCreate"}
    assert volumes["cache-hdd"]["emptyDir"] == {"sizeLimit": str(1024**4)}
    (container,) = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["cache-hdd"] == f"{HOME}/cache/hdd" and mounts["cache-ssd"] == "/mnt/nvme/datacache"
    # MEM quota (2Gi) is memory the pod needs on top of the process's 256Mi
    assert container["resources"]["requests"]["memory"] == str(2 * 1024**3 + 256 * 1024**2)
    script = container["command"][2]
    assert script.startswith("datacache apply -f /etc/datacache/resources.yaml && exec datacache worker serve imagenet")
    assert '--index "${POD_NAME##*-}"' in script and "--port 7700" in script
    assert pod["affinity"]["nodeAffinity"] == dataset.spec.node_affinity


def test_pods_find_workers_through_the_headless_service():
    """Every datacache container selects DNS membership; the SRV name discovery asks is the
    Service's, it lists ready pods only, and StatefulSet pod names give the --index ids."""
    dataset, runtime, dataload = _load()
    owner = _owner(runtime)
    svc = manifests.headless_service(runtime, owner)
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is False
    (port,) = svc["spec"]["ports"]
    # Kubernetes DNS: _<port name>._tcp.<service>.<namespace>.svc.<cluster domain>
    assert f"_{port['name']}._tcp.{svc['metadata']['name']}.ml.svc.cluster.local." == srv_name("ml", "imagenet")
    for kind in ("StatefulSet", "DaemonSet"):
        workload = manifests.worker_workload(dataset, runtime, owner, Settings(worker_kind=kind))
        pod = workload["spec"]["template"]
        assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
        (container,) = pod["spec"]["containers"]
        assert {"name": "DATACACHE_MEMBERSHIP", "value": "dns"} in container["env"]
        assert container["ports"] == [{"name": port["name"], "containerPort": port["targetPort"]}]
    sts = manifests.worker_workload(dataset, runtime, owner, Settings())
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"]
    # pods are <StatefulSet name>-<ordinal>, started with --index <ordinal>
    assert [ordinal_worker_id(f"{sts['metadata']['name']}-{i}", "imagenet") for i in range(3)] == [
        "worker-0", "worker-1", "worker-2"]
    assert ordinal_worker_id("10-0-0-7", "imagenet") is None  # a DaemonSet target: asked by /healthz
    job = manifests.dataload_job(dataload, dataset, runtime, _owner(dataload), Settings())
    assert {"name": "DATACACHE_MEMBERSHIP", "value": "dns"} in job["spec"]["template"]["spec"]["containers"][0]["env"]


def test_secrets_reach_pods_only_as_files_and_references():
    for obj in _all(Settings()):
        if obj["kind"] == "Secret":
            continue
        text = yaml.safe_dump(obj)
        assert "t0ken" not in text
        for container in (obj.get("spec", {}).get("template", {}).get("spec", {}).get("containers") or []):
            for env in container["env"]:
                assert "value" not in env or env["name"] in ("DATACACHE_HOME", "DATACACHE_MEMBERSHIP", "DATACACHE_CLUSTER_DOMAIN")
            assert {"name": "secret-0", "mountPath": f"{HOME}/secrets/s3-creds", "readOnly": True} in container["volumeMounts"]
    dataset, runtime, _ = _load()
    volumes, _ = manifests.secret_volumes(dataset)
    assert volumes == [{"name": "secret-0", "secret": {"secretName": "s3-creds", "defaultMode": 0o400, "items": [
        {"key": "access-key", "path": "access-key"}, {"key": "secret-key", "path": "secret-key"}]}}]


def test_config_map_holds_resources_that_load_back():
    dataset, runtime, _ = _load()
    cm = manifests.config_map(dataset, runtime, _owner(runtime))
    loaded = load_resources("resources.yaml", cm["data"]["resources.yaml"])
    assert [r.kind for r in loaded] == ["Dataset", "CacheRuntime"]
    assert loaded[0] == dataset
    # the real count: with DNS membership the pod's plane reads through the workers, starts none
    assert loaded[1].spec.replicas == runtime.spec.replicas and loaded[1].spec.autoscale is None
    assert loaded[1].spec.tieredstore == runtime.spec.tieredstore


def test_dataload_job_runs_warmup_on_the_targets():
    dataset, runtime, dataload = _load()
    job = manifests.dataload_job(dataload, dataset, runtime, _owner(dataload), Settings())
    assert job["metadata"]["name"] == "warm-dataload"
    script = job["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert script.endswith("exec datacache warmup imagenet /s3/train '/labels/*.csv' -q -n ml")
    traced = dataload.model_copy(update={"spec": dataload.spec.model_copy(update={
        "target": [*dataload.spec.target, DataLoadTarget(trace="job-42")]})})
    job = manifests.dataload_job(traced, dataset, runtime, _owner(dataload), Settings())
    script = job["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert script.endswith("exec datacache warmup imagenet /s3/train '/labels/*.csv' --from-trace=job-42 -q -n ml")


def test_job_phase_follows_the_job():
    assert manifests.job_phase(None) == "Pending"
    assert manifests.job_phase({"active": 1}) == "Executing"
    assert manifests.job_phase({"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}) == "Complete"
    assert manifests.job_phase({"failed": 4, "conditions": [{"type": "Failed", "status": "True"}]}) == "Failed"


def _expanded_args(workload, **env):
    """The worker command's arguments after the shell's expansion (the script with ``echo`` in
    place of the datacache commands), for a pod with environment ``env``."""
    script = workload["spec"]["template"]["spec"]["containers"][0]["command"][2]
    script = script.replace("datacache apply -f /etc/datacache/resources.yaml && exec datacache", "exec echo")
    out = subprocess.run(["sh", "-c", script], env={"PATH": os.environ["PATH"], **env},
                         capture_output=True, text=True, check=True).stdout.split()
    return {flag: out[i + 1] for i, flag in enumerate(out) if flag.startswith("--")}


def test_worker_index_and_address_come_from_the_pod():
    dataset, runtime, _ = _load()
    sts = manifests.worker_workload(dataset, runtime, _owner(runtime), Settings())
    args = _expanded_args(sts, POD_NAME="imagenet-worker-7", NODE_NAME="gpu-node-3")
    assert args["--index"] == "7" and args["--advertise"] == "imagenet-worker-7.imagenet-worker.ml.svc.cluster.local"
    ds = manifests.worker_workload(dataset, runtime, _owner(runtime), Settings(worker_kind="DaemonSet"))
    indexes = {node: _expanded_args(ds, POD_NAME="imagenet-worker-x2x9q", NODE_NAME=node)["--index"]
               for node in ("gpu-node-1", "gpu-node-2")}
    for node, index in indexes.items():  # POSIX cksum of the node name: stable on every restart there
        expected = subprocess.run(["cksum"], input=node, capture_output=True, text=True, check=True).stdout.split()[0]
        assert index == expected and index.isdigit()
        assert _expanded_args(ds, POD_NAME="imagenet-worker-other", NODE_NAME=node)["--index"] == index
    assert len(set(indexes.values())) == 2


def test_cron_dataload_is_a_cronjob_and_on_event_a_job_per_sync_event():
    dataset, runtime, dataload = _load()
    cron = dataload.model_copy(update={"spec": dataload.spec.model_copy(update={"policy": "Cron", "schedule": "0 3 * * *"})})
    cronjob = manifests.dataload_job(cron, dataset, runtime, _owner(dataload), Settings())
    validate(cronjob)
    assert (cronjob["kind"], cronjob["spec"]["schedule"], cronjob["spec"]["concurrencyPolicy"]) == (
        "CronJob", "0 3 * * *", "Forbid")
    job = manifests.dataload_job(dataload, dataset, runtime, _owner(dataload), Settings())
    assert cronjob["spec"]["jobTemplate"]["spec"] == job["spec"]  # the same warmup run
    assert manifests.cron_status({"active": [{"name": "warm-dataload-29012"}], "lastScheduleTime": "2026-11-29T03:00:00Z"}) == {
        "phase": "Executing", "lastScheduleTime": "2026-11-29T03:00:00Z"}
    assert manifests.cron_status(None) == {"phase": "Pending"}
    on_event = dataload.model_copy(update={"spec": dataload.spec.model_copy(update={"policy": "OnEvent"})})
    event_job = manifests.dataload_job(on_event, dataset, runtime, _owner(dataload), Settings(), "2026-11-29T10:00:00Z")
    validate(event_job)
    assert event_job["kind"] == "Job" and event_job["spec"] == job["spec"]
    assert event_job["metadata"]["annotations"] == {"datacache.io/sync-event": "2026-11-29T10:00:00Z"}
    # warmup pods never talk to the API server: no ServiceAccount token in them
    assert job["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_cluster_domain_reaches_every_pod(monkeypatch):
    monkeypatch.setenv("DATACACHE_CLUSTER_DOMAIN", "corp.example.")
    settings = Settings.from_env()
    assert settings.cluster_domain == "corp.example"
    dataset, runtime, dataload = _load()
    sts = manifests.worker_workload(dataset, runtime, _owner(runtime), settings)
    job = manifests.dataload_job(dataload, dataset, runtime, _owner(dataload), settings)
    for pod in (sts["spec"]["template"]["spec"], job["spec"]["template"]["spec"]):
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert (env["DATACACHE_MEMBERSHIP"], env["DATACACHE_CLUSTER_DOMAIN"]) == ("dns", "corp.example")
    args = _expanded_args(sts, POD_NAME="imagenet-worker-2", NODE_NAME="n")
    assert args["--advertise"] == "imagenet-worker-2.imagenet-worker.ml.svc.corp.example"
    # the name a pod's DNS membership asks for, under that domain
    assert srv_name("ml", "imagenet", env["DATACACHE_CLUSTER_DOMAIN"]) == "_http._tcp.imagenet-worker.ml.svc.corp.example."
    monkeypatch.setenv("DATACACHE_CLUSTER_DOMAIN", "Corp_Example")
    with pytest.raises(ValueError) as err:
        Settings.from_env()
    assert str(err.value) == ("DATACACHE_CLUSTER_DOMAIN='Corp_Example': not a DNS domain (e.g. cluster.local); "
                              "set the chart's operator.clusterDomain to the kubelet's --cluster-domain")


_AS_WORKER = ["setpriv", "--reuid=10001", "--regid=10001", "--clear-groups"]
_TIER_CHECK = """
import sys
from datacache.cache.disk import DiskTier
tier = DiskTier(sys.argv[1], 1 << 20)
print(tier.healthy and tier.put("ds/f/0", b"x" * 4096) and tier.get("ds/f/0") == b"x" * 4096)
"""


def _worker_can_cache(path):
    """Whether a process of the worker's uid (10001) opens a DiskTier at ``path`` healthy and
    keeps a block there (what ``datacache worker serve`` does with its tier)."""
    out = subprocess.run([*_AS_WORKER, sys.executable, "-c", _TIER_CHECK, path], capture_output=True, text=True,
                         env={**os.environ, "HOME": "/tmp"}, check=True).stdout.split()
    return out[-1] == "True"


def test_host_path_tier_is_handed_to_the_worker_uid():
    """A hostPath tier as the kubelet creates it (DirectoryOrCreate: root, 0755) cannot be written
    by the worker (uid 10001; fsGroup does not apply to hostPath). The rendered init container,
    run here with only the capabilities it declares, makes the runtime's directory there 0700 and
    the worker's, and the worker then caches in it; a second run (pod restart) changes nothing."""
    node = tempfile.mkdtemp(prefix="node-", dir="/tmp")
    try:
        os.chmod(node, 0o755)
        level = os.path.join(node, "nvme")
        os.mkdir(level, 0o755)  # what the kubelet makes for DirectoryOrCreate
        dataset, runtime, _ = load_resources("k8s.yaml", RESOURCES.replace("/mnt/nvme/datacache", level))
        for kind in ("StatefulSet", "DaemonSet"):
            workload = manifests.worker_workload(dataset, runtime, _owner(runtime), Settings(worker_kind=kind))
            validate(workload)
            pod = workload["spec"]["template"]["spec"]
            assert (pod["securityContext"]["runAsUser"], pod["containers"][0]["securityContext"]) == (
                10001, manifests.RESTRICTED)
            (init,) = pod["initContainers"]
            assert init["securityContext"] == {
                "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsUser": 0,
                "runAsNonRoot": False, "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "DAC_OVERRIDE", "FOWNER"]}}
            assert init["volumeMounts"] == [{"name": "cache-ssd", "mountPath": level}]
            assert {"name": "cache-ssd", "mountPath": level} in pod["containers"][0]["volumeMounts"]
        worker_dir = os.path.join(level, "ml", "imagenet", "worker-0")
        assert not _worker_can_cache(worker_dir)  # today's failure: every read goes to the UFS
        caps = ["setpriv", "--bounding-set=-all,+chown,+dac_override,+fowner", "--inh-caps=-all"]
        for _ in range(2):
            subprocess.run([*caps, *init["command"]], check=True)
            runtime_dir = os.stat(os.path.join(level, "ml", "imagenet"))
            assert (runtime_dir.st_uid, runtime_dir.st_gid, stat.S_IMODE(runtime_dir.st_mode)) == (10001, 10001, 0o700)
            assert _worker_can_cache(worker_dir)
        assert (os.stat(level).st_uid, stat.S_IMODE(os.stat(level).st_mode)) == (0, 0o755)  # the level itself: untouched
    finally:
        shutil.rmtree(node)
