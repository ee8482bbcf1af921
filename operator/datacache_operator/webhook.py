"""The FUSE sidecar a training pod gets when it is labelled ``datacache.io/dataset: NAME``.

:func:`inject` is a pure function from a pod spec to the fields the mutating webhook replaces.
The sidecar is a native sidecar (an init container with ``restartPolicy: Always``, Kubernetes
1.29+) whose startup probe passes once the FUSE mount is up, so app containers start with the
dataset already mounted. It runs ``datacache mount`` on the root of a shared emptyDir with
``mountPropagation: Bidirectional``; app containers mount the same volume read-only with
``HostToContainer`` at the mount path (annotation ``datacache.io/mount-path``, default
``/data/<NAME>``), so the FUSE mount made in the sidecar appears there, and ``allow_other`` lets a
non-root app read it.

Privileges: the API server accepts ``Bidirectional`` only on a privileged container
(pkg/apis/core/validation: "Bidirectional mount propagation is available only to privileged
containers"), so the sidecar is privileged; it is the only such container, app containers are
not touched beyond the volume mount. For a JuiceFSRuntime the sidecar's ``datacache mount`` runs
``juicefs mount`` (supervised), with the runtime's levels as its cache volumes. /dev/fuse comes from a device plugin's extended resource when
one is configured, else from a hostPath char device. Secrets named by encryptOptions are mounted
into the sidecar only, as files.

Placement: a preferred pod affinity (weight 100) to nodes running the runtime's workers, so reads
are short-circuit local when the scheduler can.
"""

from __future__ import annotations

import copy
import posixpath
from typing import Any

from datacache.api.models import CacheRuntime, Dataset

from .manifests import base_volumes, fuse_device, pod_env, secret_volumes, tier_volumes, worker_labels
from .settings import Settings

MOUNT_PATH_ANNOTATION = "datacache.io/mount-path"
_DEV_FUSE = "datacache-dev-fuse"
SIDECAR = "datacache-fuse"
_SHARED = "datacache-fuse-mnt"
_FUSE_ROOT = "/datacache"


class InjectionError(ValueError):
    """The pod asks for a mount in a way that cannot work (one line, naming the field and fix)."""


def mount_path(annotations: dict[str, str] | None, dataset: str) -> str:
    """Where app containers see the dataset. Raises :class:`InjectionError` for a relative path."""
    path = (annotations or {}).get(MOUNT_PATH_ANNOTATION, f"/data/{dataset}")
    if not path.startswith("/") or ".." in path.split("/"):
        raise InjectionError(f"annotation {MOUNT_PATH_ANNOTATION}: '{path}' must be an absolute path "
                             "without '..', e.g. /data/" + dataset)
    return posixpath.normpath(path)


def _sidecar(dataset: Dataset, runtime: CacheRuntime, settings: Settings, mounts: list[dict],
             memory: int = 0) -> dict[str, Any]:
    """The sidecar container; ``memory``: bytes to request (a JuiceFS client's buffer), 0 for none."""
    name, namespace = dataset.metadata.name, dataset.metadata.namespace
    if runtime.kind == "JuiceFSRuntime":  # juicefs mount: its fuse.options are its own flags; allow_other as root
        options = []
    else:
        options = ["-o", ",".join(["allow_other", *(f"{k}={v}" if v else k for k, v in runtime.spec.fuse.options.items())])]
    mount = ["datacache", "mount", name, _FUSE_ROOT, "-n", namespace, *options]
    apply = ["datacache", "apply", "-f", "/etc/datacache/resources.yaml"]
    container: dict[str, Any] = {
        "name": SIDECAR,
        "image": settings.image,
        "command": ["sh", "-c", " ".join(apply) + " && exec " + " ".join(mount)],
        "restartPolicy": "Always",
        "env": pod_env(runtime, settings),
        "securityContext": {"privileged": True, "runAsUser": 0, "runAsNonRoot": False},
        "startupProbe": {"exec": {"command": ["sh", "-c", f"grep -qs ' {_FUSE_ROOT} fuse' /proc/mounts"]},
                         "periodSeconds": 1, "failureThreshold": 120},
        "lifecycle": {"preStop": {"exec": {"command": ["datacache", "unmount", _FUSE_ROOT]}}},
        "volumeMounts": [*mounts, {"name": _SHARED, "mountPath": _FUSE_ROOT, "mountPropagation": "Bidirectional"}],
    }
    _, device = fuse_device(settings, _DEV_FUSE)
    container["volumeMounts"] += device.pop("volumeMounts", [])
    container.update(device)
    if memory:
        container.setdefault("resources", {}).setdefault("requests", {})["memory"] = str(memory)
    return container


def _prefer_worker_nodes(affinity: dict[str, Any] | None, runtime: CacheRuntime) -> dict[str, Any]:
    affinity = copy.deepcopy(affinity or {})
    pod_affinity = affinity.setdefault("podAffinity", {})
    preferred = pod_affinity.setdefault("preferredDuringSchedulingIgnoredDuringExecution", [])
    preferred.append({"weight": 100, "podAffinityTerm": {
        "labelSelector": {"matchLabels": worker_labels(runtime)},
        "topologyKey": "kubernetes.io/hostname"}})
    return affinity


def inject(pod: dict[str, Any], dataset: Dataset, runtime: CacheRuntime, settings: Settings) -> dict[str, Any]:
    """The pod-spec fields to replace (``initContainers``, ``containers``, ``volumes``,
    ``affinity``) so that ``pod`` mounts ``dataset``; ``{}`` when it already has the sidecar.

    Raises :class:`InjectionError` when the mount path annotation is unusable or an app container
    already uses that path."""
    spec = pod.get("spec", {})
    init = list(spec.get("initContainers") or [])
    if any(c.get("name") == SIDECAR for c in init):
        return {}  # re-invocation: already injected
    path = mount_path(pod.get("metadata", {}).get("annotations"), dataset.metadata.name)
    containers = copy.deepcopy(spec.get("containers") or [])
    for c in containers:
        for m in c.get("volumeMounts") or []:
            if posixpath.normpath(m.get("mountPath", "")) == path:
                raise InjectionError(f"container '{c.get('name')}' already mounts volume '{m.get('name')}' at "
                                     f"{path}: set annotation {MOUNT_PATH_ANNOTATION} to another path")
        c["volumeMounts"] = [*(c.get("volumeMounts") or []),
                             {"name": _SHARED, "mountPath": path, "readOnly": True,
                              "mountPropagation": "HostToContainer"}]
    base_vols, base_mounts = base_volumes(runtime)
    secret_vols, secret_mounts = secret_volumes(dataset)
    own = [{**v, "name": f"datacache-{v['name']}"} for v in base_vols + secret_vols]
    own_mounts = [{**m, "name": f"datacache-{m['name']}"} for m in base_mounts + secret_mounts]
    own.append({"name": _SHARED, "emptyDir": {}})
    own += fuse_device(settings, _DEV_FUSE)[0]
    memory = 0
    if runtime.kind == "JuiceFSRuntime":  # the JuiceFS client's cache directories: its levels
        levels, level_mounts = [], []
        memory, host_mounts = tier_volumes(runtime, levels, level_mounts)
        own += [{**v, "name": f"datacache-{v['name']}"} for v in levels]
        own_mounts += [{**m, "name": f"datacache-{m['name']}"} for m in level_mounts + host_mounts]
    taken = {v.get("name") for v in spec.get("volumes") or []} & {v["name"] for v in own}
    if taken:
        raise InjectionError(f"volume name(s) {', '.join(sorted(taken))} are reserved for datacache's FUSE "
                             "sidecar: rename the pod's volume")
    return {
        "initContainers": [*init, _sidecar(dataset, runtime, settings, own_mounts, memory)],
        "containers": containers,
        "volumes": [*(spec.get("volumes") or []), *own],
        "affinity": _prefer_worker_nodes(spec.get("affinity"), runtime),
    }
