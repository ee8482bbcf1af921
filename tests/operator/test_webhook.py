"""The FUSE sidecar mutation on realistic pod specs: the mutated pods are valid Pods, apps see the
mount read-only with HostToContainer, only the sidecar is privileged, nothing existing is lost."""

from __future__ import annotations

import copy
import os
import re

import pytest
import yaml

from datacache_operator import webhook
from datacache_operator.settings import Settings
from test_manifests import _load

from operator_schemas import validate

TRAINING_POD = """
apiVersion: v1
kind: Pod
metadata:
  name: train-0
  namespace: ml
  labels: {datacache.io/dataset: imagenet, app: train}
  annotations: {datacache.io/mount-path: /mnt/imagenet}
spec:
  securityContext: {runAsNonRoot: true, runAsUser: 1000, fsGroup: 1000}
  initContainers:
    - {name: fetch-code, image: alpine:3.20, command: [sh, -c, "echo ok"]}
  containers:
    - name: trainer
      image: pytorch/pytorch:2.4.0
      command: [python, train.py, --data, /mnt/imagenet]
      securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
      volumeMounts: [{name: shm, mountPath: /dev/shm}, {name: ckpt, mountPath: /ckpt}]
      resources: {limits: {nvidia.com/gpu: "8"}}
    - name: metrics
      image: prom/node-exporter:v1.8.0
  volumes:
    - {name: shm, emptyDir: {medium: Memory, sizeLimit: 16Gi}}
    - {name: ckpt, persistentVolumeClaim: {claimName: checkpoints}}
  affinity:
    podAntiAffinity:
      preferredDuringSchedulingIgnoredDuringExecution:
        - weight: 10
          podAffinityTerm: {labelSelector: {matchLabels: {app: train}}, topologyKey: kubernetes.io/hostname}
"""


def _mutate(pod, settings=Settings(image="datacache:test")):
    dataset, runtime, _ = _load()
    changes = webhook.inject(pod, dataset, runtime, settings)
    mutated = copy.deepcopy(pod)
    mutated["spec"].update(changes)
    return mutated


def test_sidecar_injected_into_multi_container_non_root_pod():
    pod = yaml.safe_load(TRAINING_POD)
    mutated = _mutate(pod)
    validate(mutated)
    spec = mutated["spec"]
    # existing containers, init containers and volumes are kept, in order
    assert [c["name"] for c in spec["initContainers"]] == ["fetch-code", "datacache-fuse"]
    assert [c["name"] for c in spec["containers"]] == ["trainer", "metrics"]
    assert [v["name"] for v in spec["volumes"]][:2] == ["shm", "ckpt"]
    assert spec["securityContext"] == pod["spec"]["securityContext"]
    trainer = spec["containers"][0]
    assert trainer["volumeMounts"][:2] == pod["spec"]["containers"][0]["volumeMounts"]
    assert trainer["volumeMounts"][2] == {"name": "datacache-fuse-mnt", "mountPath": "/mnt/imagenet",
                                          "readOnly": True, "mountPropagation": "HostToContainer"}
    assert trainer["securityContext"] == pod["spec"]["containers"][0]["securityContext"]
    sidecar = spec["initContainers"][1]
    assert sidecar["restartPolicy"] == "Always" and sidecar["image"] == "datacache:test"
    assert "exec datacache mount imagenet /datacache -n ml -o allow_other" in sidecar["command"][2]
    # the API server allows Bidirectional only on privileged containers: exactly the sidecar is
    for c in spec["initContainers"] + spec["containers"]:
        bidirectional = any(m.get("mountPropagation") == "Bidirectional" for m in c.get("volumeMounts", []))
        assert bidirectional == (c["name"] == "datacache-fuse")
        assert bool((c.get("securityContext") or {}).get("privileged")) == bidirectional
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["datacache-dev-fuse"]["hostPath"] == {"path": "/dev/fuse", "type": "CharDevice"}
    assert volumes["datacache-secret-0"]["secret"]["secretName"] == "s3-creds"
    # encryptOptions reach the sidecar only, as files; no env value carries a secret
    assert not any("secret" in m["name"] for c in spec["containers"] for m in c["volumeMounts"])
    assert all("valueFrom" in e or e["name"] in ("DATACACHE_HOME", "DATACACHE_MEMBERSHIP", "DATACACHE_CLUSTER_DOMAIN")
               for e in sidecar["env"])
    # existing anti-affinity kept, preferred affinity to the runtime's worker nodes added
    assert spec["affinity"]["podAntiAffinity"] == pod["spec"]["affinity"]["podAntiAffinity"]
    (term,) = spec["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["weight"] == 100
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"]["datacache.io/runtime"] == "imagenet"


def test_device_plugin_resource_replaces_the_host_device():
    mutated = _mutate(yaml.safe_load(TRAINING_POD), Settings(fuse_device_resource="smarter-devices/fuse"))
    validate(mutated)
    sidecar = mutated["spec"]["initContainers"][-1]
    assert sidecar["resources"] == {"limits": {"smarter-devices/fuse": "1"}}
    assert "datacache-dev-fuse" not in {v["name"] for v in mutated["spec"]["volumes"]}


def test_default_mount_path_and_idempotence():
    pod = yaml.safe_load(TRAINING_POD)
    del pod["metadata"]["annotations"]
    mutated = _mutate(pod)
    assert mutated["spec"]["containers"][1]["volumeMounts"][-1]["mountPath"] == "/data/imagenet"
    dataset, runtime, _ = _load()
    assert webhook.inject(mutated, dataset, runtime, Settings()) == {}


@pytest.mark.parametrize("change, message", [
    (lambda p: p["metadata"]["annotations"].update({"datacache.io/mount-path": "data"}),
     "annotation datacache.io/mount-path: 'data' must be an absolute path"),
    (lambda p: p["metadata"]["annotations"].update({"datacache.io/mount-path": "/ckpt"}),
     "container 'trainer' already mounts volume 'ckpt' at /ckpt"),
    (lambda p: p["spec"]["volumes"].append({"name": "datacache-home", "emptyDir": {}}),
     "volume name(s) datacache-home are reserved"),
])
def test_unusable_pods_get_one_clear_error(change, message):
    pod = yaml.safe_load(TRAINING_POD)
    change(pod)
    dataset, runtime, _ = _load()
    with pytest.raises(webhook.InjectionError) as err:
        webhook.inject(pod, dataset, runtime, Settings())
    assert str(err.value).startswith(message)


def test_readme_training_pod_gets_its_mount():
    readme = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")
    with open(readme, encoding="utf-8") as f:
        text = re.search(r"```yaml\n# train-pod.yaml\n(.*?)```", f.read(), re.S).group(1)
    pod = yaml.safe_load(text)
    validate(pod)
    mutated = _mutate(pod)
    validate(mutated)
    (train,) = mutated["spec"]["containers"]
    assert train["volumeMounts"][-1]["mountPath"] == "/data/imagenet" and train["volumeMounts"][-1]["readOnly"] is True
    assert [c["name"] for c in mutated["spec"]["initContainers"]] == [webhook.SIDECAR]
