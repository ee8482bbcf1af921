"""JuiceFSRuntime on Kubernetes, as rendered: the ConfigMap the pods apply, the FUSE sidecar the
webhook injects (``datacache mount`` runs ``juicefs mount``: no ``-o`` of datacache's own, the
levels as cache volumes, secrets as files and never values), the DataLoad Job (a JuiceFS client in
its pod: privileged, /dev/fuse), and the runtime's status. Every object is validated against the
Kubernetes schemas."""

from __future__ import annotations

import copy

import yaml

from datacache.api.loader import load_resources
from datacache.control import reconcile
from datacache_operator import manifests, webhook
from datacache_operator.settings import HOME, Settings
from operator_schemas import validate
from test_webhook import TRAINING_POD

CRS = "datacache.io/v1alpha1"
RESOURCES = f"""
apiVersion: {CRS}
kind: Dataset
metadata: {{name: imagenet, namespace: ml}}
spec:
  mounts:
  - name: vol
    mountPoint: juicefs:///imagenet
    encryptOptions:
    - {{name: metaurl, valueFrom: {{secretKeyRef: {{name: jfs-secret, key: metaurl}}}}}}
    - {{name: secret-key, valueFrom: {{secretKeyRef: {{name: jfs-secret, key: secret-key}}}}}}
---
apiVersion: {CRS}
kind: JuiceFSRuntime
metadata: {{name: imagenet, namespace: ml}}
spec:
  tieredstore:
    levels:
    - {{mediumtype: MEM, quota: 512Mi}}
    - {{mediumtype: SSD, path: /mnt/nvme, quota: 100Gi}}
  fuse: {{options: {{attr-cache: "10"}}}}
---
apiVersion: {CRS}
kind: DataLoad
metadata: {{name: warm, namespace: ml}}
spec:
  dataset: {{name: imagenet, namespace: ml}}
  target: [{{path: /train}}]
"""


def _load(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(RESOURCES)
    return load_resources(str(path))


def _owner(kind):
    return {"apiVersion": CRS, "kind": kind,
            "metadata": {"name": "imagenet", "namespace": "ml", "uid": "33333333-0000-0000-0000-000000000001"}}


def test_config_map_carries_the_runtime_as_written(tmp_path):
    dataset, runtime, _ = _load(tmp_path)
    cm = manifests.config_map(dataset, runtime, _owner("JuiceFSRuntime"))
    validate(cm)
    loaded = load_resources("resources.yaml", cm["data"]["resources.yaml"])
    assert [r.kind for r in loaded] == ["Dataset", "JuiceFSRuntime"]
    assert loaded[1].spec == runtime.spec


def test_sidecar_runs_the_juicefs_client_with_secrets_as_files(tmp_path):
    dataset, runtime, _ = _load(tmp_path)
    pod = yaml.safe_load(TRAINING_POD)
    mutated = copy.deepcopy(pod)
    mutated["spec"].update(webhook.inject(pod, dataset, runtime, Settings(image="datacache:test")))
    validate(mutated)
    sidecar = next(c for c in mutated["spec"]["initContainers"] if c["name"] == webhook.SIDECAR)
    assert sidecar["command"][-1].endswith("exec datacache mount imagenet /datacache -n ml")  # no -o: juicefs flags
    assert sidecar["securityContext"]["privileged"] is True
    assert sidecar["resources"]["requests"]["memory"] == str(256 * 2**20 + 512 * 2**20)  # + --buffer-size
    volumes = {v["name"]: v for v in mutated["spec"]["volumes"]}
    assert volumes["datacache-cache-ssd"]["hostPath"] == {"path": "/mnt/nvme", "type": "DirectoryOrCreate"}
    mounts = {m["name"]: m["mountPath"] for m in sidecar["volumeMounts"]}
    assert mounts["datacache-cache-ssd"] == "/mnt/nvme"
    secret = next(v for v in volumes.values() if "secret" in v)
    assert secret["secret"] == {"secretName": "jfs-secret", "defaultMode": 0o400,
                                "items": [{"key": "metaurl", "path": "metaurl"},
                                          {"key": "secret-key", "path": "secret-key"}]}
    assert mounts[next(n for n, v in volumes.items() if "secret" in v)] == f"{HOME}/secrets/jfs-secret"
    # no container gets the dataset's secret in its environment: only the worker token is referenced
    spec = mutated["spec"]
    refs = {e["valueFrom"]["secretKeyRef"]["name"] for c in spec["initContainers"] + spec["containers"]
            for e in c.get("env") or [] if "secretKeyRef" in e.get("valueFrom", {})}
    assert refs == {"imagenet-worker-token"}


def test_dataload_job_mounts_a_client_in_its_pod(tmp_path):
    dataset, runtime, dataload = _load(tmp_path)
    for settings, device in ((Settings(), None), (Settings(fuse_device_resource="smarter-devices/fuse"),
                                                   "smarter-devices/fuse")):
        job = manifests.dataload_job(dataload, dataset, runtime, _owner("DataLoad"), settings)
        validate(job)
        pod = job["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["securityContext"] == {"privileged": True, "runAsUser": 0, "runAsNonRoot": False}
        assert "datacache warmup imagenet /train" in container["command"][-1]
        assert {"name": "cache-ssd", "mountPath": "/mnt/nvme"} in container["volumeMounts"]
        if device:
            assert container["resources"]["limits"] == {device: "1"}
        else:
            assert {"name": "dev-fuse", "mountPath": "/dev/fuse"} in container["volumeMounts"]


def test_client_runtime_status(tmp_path):
    _, runtime, _ = _load(tmp_path)
    status = reconcile.client_runtime_status(runtime)
    assert (status["phase"], status["cacheCapacity"]) == ("Ready", "100.00GiB")
    validate({"apiVersion": CRS, "kind": "JuiceFSRuntime", "metadata": {"name": "imagenet", "namespace": "ml"},
              "spec": {}, "status": status})
