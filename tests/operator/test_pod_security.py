"""What the README's "Pod Security" paragraph tells cluster admins, checked on the pod specs the
webhook and the operator render: which Pod Security level each needs, which container is
privileged and why, what /dev/fuse is."""

from __future__ import annotations

import copy
import os
import re

import yaml

from datacache.api.loader import load_resources
from datacache_operator import manifests, webhook
from datacache_operator.settings import Settings
from pod_security import baseline_violations, level, restricted_violations
from test_manifests import RESOURCES, _load, _owner
from test_webhook import TRAINING_POD

README = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "README.md")


def _pod_security_paragraph():
    with open(README, encoding="utf-8") as f:
        text = f.read()
    start = text.index("**Pod Security (for cluster admins).**")
    return " ".join(text[start:text.index("\n\n", start)].split())


def _injected(settings):
    pod = yaml.safe_load(TRAINING_POD)
    dataset, runtime, _ = _load()
    mutated = copy.deepcopy(pod)
    mutated["spec"].update(webhook.inject(pod, dataset, runtime, settings))
    return mutated["spec"]


def test_training_pod_needs_privileged_level_for_the_sidecar_alone():
    readme = _pod_security_paragraph()
    assert "`pod-security.kubernetes.io/enforce: privileged`" in readme
    assert "`privileged: true` cannot be replaced by `capabilities: {add: [SYS_ADMIN]}`" in readme
    for settings, device in ((Settings(image="datacache:test"), ["volume datacache-dev-fuse: hostPath"]),
                             (Settings(image="datacache:test", fuse_device_resource="smarter-devices/fuse"), [])):
        spec = _injected(settings)
        assert level(spec) == "privileged"
        assert sorted(baseline_violations(spec)) == sorted([f"container {webhook.SIDECAR}: privileged", *device])
        sidecar = next(c for c in spec["initContainers"] if c["name"] == webhook.SIDECAR)
        assert sidecar["securityContext"] == {"privileged": True, "runAsUser": 0, "runAsNonRoot": False}
        # why privileged: Bidirectional propagation, which the API server allows only there
        bidirectional = [(c["name"], m["mountPath"]) for c in spec["initContainers"] + spec["containers"]
                         for m in c.get("volumeMounts") or [] if m.get("mountPropagation") == "Bidirectional"]
        assert bidirectional == [(webhook.SIDECAR, "/datacache")]
        for app in spec["containers"]:
            (mount,) = [m for m in app["volumeMounts"] if m["mountPath"] == "/mnt/imagenet"]
            assert (mount["readOnly"], mount["mountPropagation"]) == (True, "HostToContainer")
        if device:  # /dev/fuse: the host's char device
            assert {"name": "datacache-dev-fuse", "hostPath": {"path": "/dev/fuse", "type": "CharDevice"}} in spec["volumes"]
            assert {"name": "datacache-dev-fuse", "mountPath": "/dev/fuse"} in sidecar["volumeMounts"]
        else:
            assert sidecar["resources"] == {"limits": {"smarter-devices/fuse": "1"}}
    # the pod without the label: the app's own spec is baseline already, the sidecar is the only step up
    assert level(yaml.safe_load(TRAINING_POD)["spec"]) == "baseline"


def test_worker_pods_need_privileged_only_for_host_path_tiers():
    readme = _pod_security_paragraph()
    assert "Worker pods need `privileged` too when a tiered-store level has an absolute `path`" in readme
    dataset, runtime, _ = _load()
    spec = manifests.worker_workload(dataset, runtime, _owner(runtime), Settings())["spec"]["template"]["spec"]
    assert baseline_violations(spec) == ["volume cache-ssd: hostPath"]  # the init container's capabilities are baseline's
    no_host = load_resources("k8s.yaml", RESOURCES.replace("path: /mnt/nvme/datacache", "path: cache/ssd"))
    spec = manifests.worker_workload(no_host[0], no_host[1], _owner(no_host[1]), Settings())["spec"]["template"]["spec"]
    assert "initContainers" not in spec and baseline_violations(spec) == []
    # "run as uid 10001 with every capability dropped"
    (worker,) = spec["containers"]
    assert spec["securityContext"]["runAsUser"] == 10001 and worker["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert not [v for v in restricted_violations(spec) if "root" in v or "capabilities" in v or "Escalation" in v]
    assert re.search(r"namespace \(`datacache-system`\) can stay `restricted`", readme)
