"""The real operator (kopf's KopfRunner, the handlers module as deployed) against kmock's
Kubernetes API emulator on loopback: create → status → delete of a Dataset, a CacheRuntime and a
DataLoad, with the children it creates checked against the Kubernetes schemas."""

from __future__ import annotations

import base64
import importlib
import itertools
import json
import os
import socket
import time
import urllib.error
import urllib.request
from contextlib import ExitStack

import jsonpatch
import kopf
import pytest
import yaml
from anyio.from_thread import start_blocking_portal
from kmock import KubernetesEmulator, Server, action
from kopf.testing import KopfRunner

from datacache.api.crds import crds
from operator_schemas import validate
from test_webhook import TRAINING_POD

NS = "ml"
UID = {"Dataset": "11111111-0000-0000-0000-000000000001", "CacheRuntime": "11111111-0000-0000-0000-000000000002",
       "DataLoad": "11111111-0000-0000-0000-000000000003"}


class VersionedEmulator(KubernetesEmulator):
    """kmock's emulator, plus what an API server does on every write: a new
    ``metadata.resourceVersion``. kopf relies on it to tell its own patches from newer changes
    (kmock keeps objects as plain merged dicts and never changes it)."""

    _versions = itertools.count(100)

    async def _handle(self, request):
        if request.resource is not None and request.action in (action.CREATE, action.UPDATE) \
                and isinstance(request.data, dict):
            request.data.setdefault("metadata", {})["resourceVersion"] = str(next(self._versions))
        return await super()._handle(request)


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """(kmock emulator served on loopback, portal to its event loop)."""
    with ExitStack() as stack:
        portal = stack.enter_context(start_blocking_portal(backend="asyncio"))
        kmock = portal.call(VersionedEmulator)
        stack.enter_context(portal.wrap_async_context_manager(kmock))
        stack.enter_context(portal.wrap_async_context_manager(Server(kmock)))
        kmock.resources.load_bundled()
        for crd in crds():
            spec = crd["spec"]
            version = spec["versions"][0]
            key = f"{spec['group']}/{version['name']}/{spec['names']['plural']}"
            kmock.resources[key] = {
                "kind": spec["names"]["kind"], "singular": spec["names"]["singular"],
                "namespaced": spec["scope"] == "Namespaced", "subresources": set(version.get("subresources", {})),
                "verbs": {"get", "list", "watch", "patch", "create", "delete", "update"}}
        config = tmp_path / "kubeconfig"
        config.write_text(f"""
apiVersion: v1
kind: Config
current-context: kmock
clusters: [{{name: kmock, cluster: {{server: "{kmock.url}"}}}}]
users: [{{name: kmock, user: {{token: kmock-token}}}}]
contexts: [{{name: kmock, context: {{cluster: kmock, user: kmock, namespace: {NS}}}}}]
""")
        monkeypatch.setenv("KUBECONFIG", str(config))
        monkeypatch.setenv("DATACACHE_OPERATOR_RETRY_S", "0.5")
        monkeypatch.setenv("DATACACHE_IMAGE", "datacache:test")
        with socket.socket() as s:  # a free loopback port for the admission server
            s.bind(("127.0.0.1", 0))
            monkeypatch.setenv("DATACACHE_WEBHOOK_PORT", str(s.getsockname()[1]))
        monkeypatch.delenv("DATACACHE_WEBHOOK_CERT_DIR", raising=False)
        yield kmock, portal


def operator_registry():
    """A fresh kopf registry holding the operator's handlers, built with this test's environment
    (settings are read at import; a reload into the global registry would add duplicates)."""
    registry = kopf.OperatorRegistry()
    kopf.on.login(registry=registry)(kopf.login_with_kubeconfig)  # the default registry has it built in
    kopf.set_default_registry(registry)
    import datacache_operator.handlers as handlers
    importlib.reload(handlers)
    return registry


def run_operator():
    """The operator as deployed (the handlers module, watching namespace NS) under kopf's
    KopfRunner, with a fresh registry built from this test's environment."""
    registry = operator_registry()
    settings = kopf.OperatorSettings()
    settings.scanning.disabled = True  # kmock 0.8 cannot list cluster-scoped core resources (namespaces)
    return KopfRunner(["run", "--standalone", "--namespace", NS, "-m", "datacache_operator.handlers"],
                      settings=settings, registry=registry, timeout=60)


def _resource(kind, name, spec, uid=None):
    return {"apiVersion": "datacache.io/v1alpha1", "kind": kind,
            "metadata": {"name": name, "namespace": NS, "uid": uid or UID[kind], "resourceVersion": "1",
                         "generation": 1, "creationTimestamp": "2026-11-29T10:00:00Z"},
            "spec": spec}


def _wait(check, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
            if result:
                return result
        except KeyError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {check.__doc__ or check}")
        time.sleep(0.1)


def _review(pod):
    """The operator's AdmissionReview response for creating ``pod``."""
    return admission_review(pod, {"group": "", "version": "v1", "kind": "Pod"}, "pods", "fuse-sidecar")


def admission_review(obj, kind: dict, resource: str, path: str) -> dict:
    """The operator's webhook server's answer (``response``) to an AdmissionReview creating ``obj``
    (of ``kind`` {group, version, kind} and plural ``resource``), POSTed to ``/path``."""
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "review-1", "kind": kind,
        "resource": {"group": kind["group"], "version": kind["version"], "resource": resource}, "namespace": NS,
        "operation": "CREATE", "userInfo": {"username": "alice"}, "object": obj, "dryRun": False}}
    request = urllib.request.Request(f"http://127.0.0.1:{os.environ['DATACACHE_WEBHOOK_PORT']}/{path}",
                                     data=json.dumps(review).encode(), headers={"Content-Type": "application/json"})
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                return json.load(resp)["response"]
        except urllib.error.URLError:  # the server is still starting
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _get(kmock, resource, name):
    obj = kmock.objects[resource, NS, name]
    if obj.deleted:
        raise KeyError(name)
    return obj.raw


def test_operator_create_status_delete(cluster):
    kmock, portal = cluster
    crs = "datacache.io/v1alpha1"
    kmock.objects[f"{crs}/datasets", NS, "imagenet"] = _resource("Dataset", "imagenet", {
        "mounts": [{"name": "s3", "mountPoint": "s3://bucket/imagenet", "encryptOptions": [
            {"name": "secret", "valueFrom": {"secretKeyRef": {"name": "s3-creds", "key": "secret-key"}}}]}]})
    kmock.objects[f"{crs}/cacheruntimes", NS, "imagenet"] = _resource("CacheRuntime", "imagenet", {
        "replicas": 2, "tieredstore": {"levels": [{"mediumtype": "SSD", "path": "/mnt/nvme", "quota": "100Gi"}]}})
    kmock.objects[f"{crs}/cacheruntimes", NS, "broken"] = _resource("CacheRuntime", "broken", {
        "tieredstore": {"levels": [{"mediumtype": "SSD", "path": "/mnt/nvme", "quota": "1Gi", "high": 0.5, "low": 0.9}]}},
        uid="11111111-0000-0000-0000-00000000000b")
    kmock.objects[f"{crs}/dataloads", NS, "nightly"] = _resource("DataLoad", "nightly", {
        "dataset": {"name": "imagenet", "namespace": NS}, "policy": "Cron", "schedule": "0 3 * * *"},
        uid="11111111-0000-0000-0000-00000000000c")
    kmock.objects[f"{crs}/dataloads", NS, "warm"] = _resource("DataLoad", "warm", {
        "dataset": {"name": "imagenet", "namespace": NS}, "target": [{"path": "/train"}]})

    with run_operator() as runner:
        # CacheRuntime: children created, owned, valid; status says no worker is ready yet
        sts = _wait(lambda: _get(kmock, "apps/v1/statefulsets", "imagenet-worker"))
        children = [sts, _get(kmock, "v1/services", "imagenet-worker"), _get(kmock, "v1/configmaps", "imagenet-config"),
                    _get(kmock, "v1/secrets", "imagenet-worker-token")]
        for child in children:
            validate(child)
            assert child["metadata"]["ownerReferences"][0]["uid"] == UID["CacheRuntime"]
        assert sts["spec"]["replicas"] == 2
        assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == "datacache:test"
        token = children[3]["stringData"]["token"]
        assert len(token) >= 43 and token not in str(sts)
        status = _wait(lambda: _get(kmock, f"{crs}/cacheruntimes", "imagenet").get("status", {}).get("phase"))
        runtime_status = _get(kmock, f"{crs}/cacheruntimes", "imagenet")["status"]
        assert status == "NotReady"
        assert runtime_status["desiredWorkers"] == 2 and runtime_status["readyWorkers"] == 0
        assert runtime_status["selector"] == ("app.kubernetes.io/name=datacache,app.kubernetes.io/component=worker,"
                                              "datacache.io/runtime=imagenet")

        # Dataset: bound to its runtime, metadata not synced while no worker is ready
        def dataset_phase():
            """the Dataset's status"""
            return _get(kmock, f"{crs}/datasets", "imagenet").get("status", {}).get("phase")
        assert _wait(dataset_phase) == "Pending"
        condition = _get(kmock, f"{crs}/datasets", "imagenet")["status"]["conditions"][0]
        assert (condition["reason"], condition["status"]) == ("NotSynced", "False")

        # Admission: the operator's webhook server mutates a training pod (AdmissionReview over HTTP)
        pod = yaml.safe_load(TRAINING_POD)
        response = _review(pod)
        assert response["allowed"] is True and response["uid"] == "review-1"
        mutated = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
        validate(mutated)
        assert [c["name"] for c in mutated["spec"]["initContainers"]] == ["fetch-code", "datacache-fuse"]
        assert mutated["spec"]["initContainers"][1]["image"] == "datacache:test"
        assert mutated["spec"]["containers"][0]["volumeMounts"][-1]["mountPath"] == "/mnt/imagenet"
        pod["metadata"]["labels"]["datacache.io/dataset"] = "nosuch"
        denied = _review(pod)
        assert denied["allowed"] is False
        assert denied["status"]["message"] == ("pod label datacache.io/dataset=nosuch: no Dataset 'nosuch' in "
                                               "namespace 'ml': create it first or fix the label")

        # DataLoad: a Job runs warmup; the status follows the Job
        job = _wait(lambda: _get(kmock, "batch/v1/jobs", "warm-dataload"))
        validate(job)
        assert job["metadata"]["ownerReferences"][0]["uid"] == UID["DataLoad"]
        assert "exec datacache warmup imagenet /train -q -n ml" in job["spec"]["template"]["spec"]["containers"][0]["command"][2]
        assert _wait(lambda: _get(kmock, f"{crs}/dataloads", "warm").get("status", {}).get("phase")) == "Pending"
        kmock.objects["batch/v1/jobs", NS, "warm-dataload"].patch({"status": {"active": 1}})
        _wait(lambda: _get(kmock, f"{crs}/dataloads", "warm")["status"]["phase"] == "Executing")
        kmock.objects["batch/v1/jobs", NS, "warm-dataload"].patch({"status": {
            "active": 0, "succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}})
        _wait(lambda: _get(kmock, f"{crs}/dataloads", "warm")["status"]["phase"] == "Complete")

        # a Cron DataLoad becomes a CronJob on its schedule
        cron = _wait(lambda: _get(kmock, "batch/v1/cronjobs", "nightly-dataload"))
        validate(cron)
        assert cron["spec"]["schedule"] == "0 3 * * *"
        assert cron["metadata"]["ownerReferences"][0]["uid"] == "11111111-0000-0000-0000-00000000000c"
        assert _wait(lambda: _get(kmock, f"{crs}/dataloads", "nightly").get("status", {}).get("phase")) == "Pending"

        # a wrong spec is a permanent failure, reported as an event naming resource, field and fix
        def broken_reported():
            """an event about the broken runtime"""
            posted = [r.data for r in kmock[kmock.resource("v1/events")] if r.method == "POST"]
            return [(e["reason"], e["message"]) for e in posted if e["involvedObject"]["name"] == "broken"]
        assert _wait(broken_reported) == [("InvalidSpec", "CacheRuntime ml/broken: spec.tieredstore.levels[0].low: "
                                                          "low watermark 0.9 must be below high watermark 0.5")]
        assert ("apps/v1/statefulsets", NS, "broken-worker") not in kmock.objects

        # delete: the resources go away (kmock has no garbage collector: the ownerReferences
        # checked above are what makes Kubernetes delete the children)
        for plural, name in (("dataloads", "warm"), ("cacheruntimes", "imagenet"), ("datasets", "imagenet")):
            portal.call(kmock.delete, f"/apis/{crs}/namespaces/{NS}/{plural}/{name}")
        _wait(lambda: all(kmock.objects[f"{crs}/{p}", NS, n].deleted
                          for p, n in (("dataloads", "warm"), ("cacheruntimes", "imagenet"), ("datasets", "imagenet"))))
        time.sleep(0.5)
    assert runner.exception is None
    assert runner.exit_code == 0
    assert "Traceback" not in runner.output
