"""Child objects of the datacache resources, as plain dicts (pure functions, no API calls).

A CacheRuntime or ThinRuntime ``NAME`` becomes: ConfigMap ``NAME-config`` (``resources.yaml``:
the Dataset and the runtime, and a ThinRuntime's ThinRuntimeProfile, which every datacache
container applies to its own ``$DATACACHE_HOME`` before it starts), Secret ``NAME-worker-token`` (the workers' bearer token), headless Service
``NAME-worker`` (stable DNS names for membership) and the workers: a StatefulSet (one pod per
replica, ``--index`` from the pod's ordinal) or a DaemonSet (one worker per node; a ThinRuntime,
whose ``replicas`` is 0 or 1, always gets a StatefulSet). A ThinRuntime's workers open its UFS
through the profile's plugin or FUSE command, as embedded does; a FUSE command needs /dev/fuse and
mount privileges, so those workers (and only those) run privileged. A JuiceFSRuntime ``NAME``
becomes the ConfigMap and the token Secret only: its JuiceFS clients run where the data is read,
in the FUSE sidecar the webhook injects into a labelled pod (:mod:`.webhook`) and in its
DataLoads' Jobs, each privileged with /dev/fuse and the levels as cache directories
(:func:`juicefs_client`). A DataLoad
becomes Job ``NAME-dataload`` running ``datacache warmup`` (a CronJob for policy Cron; for policy
OnEvent, a Job per metadata sync that touched its targets). A Dataset's metadata sync is in
:mod:`.syncjob`. Every child carries an ownerReference
to its resource, so deleting the resource deletes them (Kubernetes' garbage collector).

Tiered-store volumes, per level: MEM lives in the worker's memory (its quota is added to the
container's memory request); an absolute ``path`` is a hostPath directory on the node (cache that
survives pod restarts, e.g. a node's NVMe), whose runtime directory the init container
``cache-dirs`` hands to the non-root worker (:func:`cache_dirs_init`); a relative ``path`` is an emptyDir with
``sizeLimit`` = quota under ``$DATACACHE_HOME``. Secrets named by ``encryptOptions`` are mounted
read-only as files at ``$DATACACHE_HOME/secrets/<secret>/<key>``, where the embedded credential
lookup (:mod:`datacache.ufs.credentials`) reads them: values never appear in a pod spec.
"""

from __future__ import annotations

import posixpath
import shlex
from typing import Any, Mapping

from datacache.api.loader import to_yaml
from datacache.api.models import CacheRuntime, DataLoad, Dataset, ThinRuntimeProfile
from datacache.cluster.discovery import PORT_NAME, service_name
from datacache.control.kubestatus import SYNC_EVENT_ANNOTATION

from .settings import CONFIG_DIR, HOME, WORKER_PORT, Settings

RUNTIME_LABEL = "datacache.io/runtime"
"""Label on worker pods naming their runtime (the scale subresource's selector uses it)."""
DATASET_LABEL = "datacache.io/dataset"
"""Label on training pods that asks the webhook for a FUSE mount of that dataset."""
_NON_ROOT = 10001  # the image's "datacache" user


def owner_reference(body: Mapping[str, Any]) -> dict[str, Any]:
    """An ownerReference to API object ``body`` (needs ``metadata.uid``): the garbage collector
    deletes the child when the owner is deleted."""
    meta = body["metadata"]
    return {"apiVersion": body["apiVersion"], "kind": body["kind"], "name": meta["name"],
            "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}


def child_meta(name: str, namespace: str, labels: dict[str, str], owner: Mapping[str, Any]) -> dict[str, Any]:
    """``metadata`` of a child object named ``name``, owned by API object ``owner``."""
    return {"name": name, "namespace": namespace, "labels": labels,
            "ownerReferences": [owner_reference(owner)]}


def worker_labels(runtime: CacheRuntime) -> dict[str, str]:
    """Labels of a runtime's worker pods (also the Service's and the scale selector's)."""
    return {"app.kubernetes.io/name": "datacache", "app.kubernetes.io/component": "worker",
            RUNTIME_LABEL: runtime.metadata.name}


def selector(runtime: CacheRuntime) -> str:
    """The workers' label selector as text (``status.selector``, read by the HPA)."""
    return ",".join(f"{k}={v}" for k, v in worker_labels(runtime).items())


def worker_port(runtime: CacheRuntime) -> int:
    """The workers' TCP port (data endpoints and /metrics)."""
    return runtime.spec.worker.port or WORKER_PORT


def config_map(dataset: Dataset, runtime: CacheRuntime, owner: Mapping[str, Any],
               profile: ThinRuntimeProfile | None = None) -> dict[str, Any]:
    """ConfigMap ``NAME-config`` with ``resources.yaml``: the Dataset and the runtime (a
    CacheRuntime, JuiceFSRuntime or ThinRuntime; with a ThinRuntime its ``profile`` first) as each pod applies them
    locally. The copy keeps the real ``replicas`` (so a pod with ``DATACACHE_MEMBERSHIP=dns`` reads
    through the workers DNS lists and starts none of its own, see
    :func:`datacache.control.supervisor.external_workers`) and drops autoscale (the operator drives
    the scale subresource, not the pods)."""
    spec = runtime.spec
    local = runtime.model_copy(update={"spec": spec.model_copy(update={"autoscale": None})}) \
        if "autoscale" in type(spec).model_fields else runtime
    name = runtime.metadata.name
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": child_meta(f"{name}-config", runtime.metadata.namespace, worker_labels(runtime), owner),
            "data": {"resources.yaml": to_yaml([*([profile] if profile else []), dataset, local])}}


def token_secret(runtime: CacheRuntime, token: str, owner: Mapping[str, Any]) -> dict[str, Any]:
    """Secret ``NAME-worker-token`` holding the workers' bearer ``token`` (created once)."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": child_meta(f"{runtime.metadata.name}-worker-token", runtime.metadata.namespace,
                              worker_labels(runtime), owner),
            "stringData": {"token": token}}


def headless_service(runtime: CacheRuntime, owner: Mapping[str, Any]) -> dict[str, Any]:
    """Headless Service ``NAME-worker``: one SRV record ``_http._tcp`` per *ready* worker pod,
    which is how every datacache container finds the workers
    (:mod:`datacache.cluster.discovery`)."""
    port = worker_port(runtime)
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": child_meta(service_name(runtime.metadata.name), runtime.metadata.namespace,
                              worker_labels(runtime), owner),
            "spec": {"clusterIP": "None", "selector": worker_labels(runtime), "publishNotReadyAddresses": False,
                     "ports": [{"name": PORT_NAME, "port": port, "targetPort": port}]}}


def _level_volume_name(medium: str) -> str:
    return f"cache-{medium.lower()}"


def secret_volumes(dataset: Dataset, *extra: Any) -> tuple[list[dict], list[dict]]:
    """(volumes, volumeMounts) putting every Secret key named by the encryptOptions of the
    dataset's mounts (and of the ``extra`` Mounts) at ``$DATACACHE_HOME/secrets/<secret>/<key>``
    (files 0400, read-only)."""
    keys: dict[str, set[str]] = {}
    for mount in [*dataset.spec.mounts, *extra]:
        for option in mount.encrypt_options:
            ref = option.value_from.secret_key_ref
            keys.setdefault(ref.name, set()).add(ref.key)
    volumes, mounts = [], []
    for i, (secret, names) in enumerate(sorted(keys.items())):
        volume = f"secret-{i}"
        volumes.append({"name": volume, "secret": {
            "secretName": secret, "defaultMode": 0o400,
            "items": [{"key": key, "path": key} for key in sorted(names)]}})
        mounts.append({"name": volume, "mountPath": posixpath.join(HOME, "secrets", secret), "readOnly": True})
    return volumes, mounts


def base_volumes(runtime: CacheRuntime) -> tuple[list[dict], list[dict]]:
    """(volumes, volumeMounts) every datacache container needs: ``$DATACACHE_HOME`` and ``/tmp``
    (emptyDirs) and the runtime's ConfigMap at ``/etc/datacache`` (read-only)."""
    # The root filesystem is read-only: state and temporary files go to emptyDirs.
    volumes = [{"name": "home", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}},
               {"name": "config", "configMap": {"name": f"{runtime.metadata.name}-config"}}]
    mounts = [{"name": "home", "mountPath": HOME}, {"name": "tmp", "mountPath": "/tmp"},
              {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}]
    return volumes, mounts


def pod_env(runtime: CacheRuntime, settings: Settings) -> list[dict]:
    """Environment of every datacache container: ``DATACACHE_HOME``, DNS membership (workers are
    found through the headless Service, whose name follows from the runtime's name and namespace,
    under ``settings.cluster_domain``),
    the worker token by reference to its Secret (the kubelet resolves it; the pod spec holds no
    value), the pod's and node's names."""
    return [
        {"name": "DATACACHE_HOME", "value": HOME},
        {"name": "DATACACHE_MEMBERSHIP", "value": "dns"},
        {"name": "DATACACHE_CLUSTER_DOMAIN", "value": settings.cluster_domain},
        {"name": "DATACACHE_WORKER_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": f"{runtime.metadata.name}-worker-token", "key": "token"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ]


def fuse_device(settings: Settings, volume: str) -> tuple[list[dict], dict[str, Any]]:
    """``(volumes, container fields)`` giving a container /dev/fuse: the device plugin's extended
    resource ``settings.fuse_device_resource`` when set, else hostPath char device ``volume``."""
    if settings.fuse_device_resource:
        return [], {"resources": {"limits": {settings.fuse_device_resource: "1"}}}
    return ([{"name": volume, "hostPath": {"path": "/dev/fuse", "type": "CharDevice"}}],
            {"volumeMounts": [{"name": volume, "mountPath": "/dev/fuse"}]})


def shell(*commands: list[str]) -> list[str]:
    """``sh -c`` running the argv lists in order (each quoted), the last one exec'd."""
    quoted = [" ".join(arg if arg.startswith('"$') else shlex.quote(arg) for arg in argv) for argv in commands]
    return ["sh", "-c", " && ".join(quoted[:-1] + ["exec " + quoted[-1]])]


def _apply() -> list[str]:
    return ["datacache", "apply", "-f", posixpath.join(CONFIG_DIR, "resources.yaml")]


RESTRICTED = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
              "capabilities": {"drop": ["ALL"]}}
"""securityContext of every non-privileged datacache container (the Pod Security "restricted" level)."""

CACHE_DIR_CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER"]
"""What the ``cache-dirs`` init container keeps of root: chown, mkdir through a 0700 directory of
another uid (a restart), chmod of a directory another uid owns."""


def runtime_cache_dir(level_path: str, runtime: CacheRuntime) -> str:
    """The directory of ``runtime``'s workers under a tier's ``level_path``:
    ``<path>/<namespace>/<name>`` (each worker keeps ``worker-<index>`` in it, see
    :meth:`datacache.control.embedded.Embedded.store_for`)."""
    return posixpath.join(level_path, runtime.metadata.namespace, runtime.metadata.name)


def cache_dirs_init(runtime: CacheRuntime, settings: Settings, mounts: list[dict]) -> dict[str, Any]:
    """Init container ``cache-dirs`` making each hostPath tier usable by the non-root worker (uid
    10001): the runtime's directory there (:func:`runtime_cache_dir`) is created, set to mode 0700
    and owned by 10001:10001. Needed because the kubelet creates a ``DirectoryOrCreate`` hostPath
    owned by root with mode 0755, and ``fsGroup`` does not apply to hostPath volumes (Kubernetes
    docs, "Configure a Security Context for a Pod"). ``mounts``: the hostPath volumeMounts (mounted
    at their level paths). It runs as root with every capability dropped but
    :data:`CACHE_DIR_CAPABILITIES`, and never touches the level path itself (it may be a disk's root)."""
    steps: list[list[str]] = []
    for mount in mounts:
        path = runtime_cache_dir(mount["mountPath"], runtime)
        steps += [["mkdir", "-p", path], ["chmod", "0700", path], ["chown", f"{_NON_ROOT}:{_NON_ROOT}", path]]
    return {"name": "cache-dirs", "image": settings.image, "command": shell(*steps),
            "securityContext": {**RESTRICTED, "runAsUser": 0, "runAsNonRoot": False,
                                "capabilities": {"drop": ["ALL"], "add": CACHE_DIR_CAPABILITIES}},
            "volumeMounts": mounts}


def tier_volumes(runtime, volumes: list[dict], mounts: list[dict]) -> tuple[int, list[dict]]:
    """Add the volumes of ``runtime``'s tiered-store levels (module docstring) to ``volumes`` and
    ``mounts``; returns ``(memory request in bytes, hostPath volumeMounts)``: 256 MiB for the
    process plus the MEM quota, and the absolute-path levels, mounted at their paths."""
    memory = 256 * 1024**2  # the process itself and the read-ahead budget
    host_mounts = []
    store = runtime.spec.tieredstore
    for level in store.levels if store is not None else []:
        if level.mediumtype == "MEM":
            memory += level.quota_bytes
            continue
        assert level.path is not None  # the model requires it for SSD/HDD
        volume = _level_volume_name(level.mediumtype)
        if level.path.startswith("/"):
            volumes.append({"name": volume, "hostPath": {"path": level.path, "type": "DirectoryOrCreate"}})
            host_mounts.append({"name": volume, "mountPath": level.path})
        else:
            volumes.append({"name": volume, "emptyDir": {"sizeLimit": str(level.quota_bytes)}})
            mounts.append({"name": volume, "mountPath": posixpath.join(HOME, level.path)})
    return memory, host_mounts


def juicefs_client(container: dict[str, Any], volumes: list[dict], runtime, settings: Settings) -> None:
    """Make ``container`` (and its pod's ``volumes``) able to run a JuiceFSRuntime's client: the
    runtime's tiered-store levels as JuiceFS cache directories (:func:`tier_volumes`; the memory
    request covers ``--buffer-size``), /dev/fuse, and privileged (mounting needs CAP_SYS_ADMIN
    past the default seccomp and AppArmor profiles). Secrets stay files (:func:`secret_volumes`):
    the client reads the metadata URL and keys from them when it starts."""
    memory, host_mounts = tier_volumes(runtime, volumes, container["volumeMounts"])
    container["volumeMounts"] += host_mounts
    device_volumes, device = fuse_device(settings, "dev-fuse")
    volumes += device_volumes
    container["volumeMounts"] += device.get("volumeMounts", [])
    container.setdefault("resources", {}).setdefault("requests", {})["memory"] = str(memory)
    container["resources"].update(device.get("resources", {}))
    container["securityContext"] = {"privileged": True, "runAsUser": 0, "runAsNonRoot": False}


def worker_workload(dataset: Dataset, runtime: CacheRuntime, owner: Mapping[str, Any], settings: Settings,
                    profile: ThinRuntimeProfile | None = None) -> dict[str, Any]:
    """The workers: a StatefulSet (``settings.worker_kind``; always for a ThinRuntime) or a DaemonSet
    named ``NAME-worker``. ``profile``: a ThinRuntime's; with a FUSE command the worker container
    gets /dev/fuse and runs privileged (mounting needs CAP_SYS_ADMIN past the default seccomp and
    AppArmor profiles)."""
    name, namespace = runtime.metadata.name, runtime.metadata.namespace
    port = worker_port(runtime)
    volumes, mounts = base_volumes(runtime)
    secret_vols, secret_mounts = secret_volumes(dataset)
    memory, host_mounts = tier_volumes(runtime, volumes, mounts)
    kind = "StatefulSet" if runtime.kind == "ThinRuntime" else settings.worker_kind
    stateful = kind == "StatefulSet"
    # StatefulSet pods are NAME-worker-<ordinal>: the ordinal is the worker's placement index. A
    # DaemonSet pod has no ordinal: its index is the CRC-32 of its node's name (POSIX cksum), the
    # same on every restart on that node, so it finds its hostPath cache directory again; two of
    # 1,000 nodes share an index with probability ~1e-4 (birthday bound over 2^32). DNS membership
    # reads a StatefulSet worker's id from its SRV target (the pod name) and asks a DaemonSet
    # worker's /healthz for it (its target is named after its address).
    index = '"${POD_NAME##*-}"' if stateful else '"$(printf %s "$NODE_NAME" | cksum | cut -d " " -f 1)"'
    advertise = f'"$POD_NAME.{name}-worker.{namespace}.svc.{settings.cluster_domain}"' if stateful else '"$NODE_NAME"'
    serve = ["datacache", "worker", "serve", name, "-n", namespace, "--host", "0.0.0.0",
             "--port", str(port), "--index", index, "--advertise", advertise]
    container = {
        "name": "worker",
        "image": settings.image,
        "command": shell(_apply(), serve),
        "env": pod_env(runtime, settings),
        "ports": [{"name": PORT_NAME, "containerPort": port}],
        "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 5},
        "resources": {"requests": {"memory": str(memory)}},
        "securityContext": RESTRICTED,
        "volumeMounts": mounts + host_mounts + secret_mounts,
    }
    if profile is not None and profile.spec.fuse is not None:
        device_volumes, device = fuse_device(settings, "dev-fuse")
        volumes += device_volumes
        container["volumeMounts"] += device.get("volumeMounts", [])
        container["resources"].update(device.get("resources", {}))
        container["securityContext"] = {"privileged": True, "runAsUser": 0, "runAsNonRoot": False}
    pod: dict[str, Any] = {
        "metadata": {"labels": worker_labels(runtime),
                     "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": str(port)}},
        "spec": {"containers": [container], "volumes": volumes + secret_vols,
                 "securityContext": {"runAsNonRoot": True, "runAsUser": _NON_ROOT, "fsGroup": _NON_ROOT},
                 "enableServiceLinks": False},
    }
    if host_mounts:
        pod["spec"]["initContainers"] = [cache_dirs_init(runtime, settings, host_mounts)]
    if dataset.spec.node_affinity:
        pod["spec"]["affinity"] = {"nodeAffinity": dataset.spec.node_affinity}
    spec: dict[str, Any] = {"selector": {"matchLabels": worker_labels(runtime)}, "template": pod}
    if stateful:
        spec.update(serviceName=service_name(name), replicas=runtime.spec.replicas, podManagementPolicy="Parallel")
    return {"apiVersion": "apps/v1", "kind": kind,
            "metadata": child_meta(f"{name}-worker", namespace, worker_labels(runtime), owner), "spec": spec}


def job_spec(labels: dict[str, str], container: dict[str, Any], volumes: list[dict],
             **pod_fields: Any) -> dict[str, Any]:
    """A Job ``spec`` running ``container`` once as the image's non-root user (3 retries), its pod
    labelled ``labels`` with ``volumes``; ``pod_fields`` are added to the pod spec
    (``serviceAccountName``, ...)."""
    return {"backoffLimit": 3, "template": {
        "metadata": {"labels": labels},
        "spec": {"restartPolicy": "Never", "containers": [container], "volumes": volumes,
                 "securityContext": {"runAsNonRoot": True, "runAsUser": _NON_ROOT, "fsGroup": _NON_ROOT},
                 "enableServiceLinks": False, "automountServiceAccountToken": False, **pod_fields}}}


def dataload_job(dataload: DataLoad, dataset: Dataset, runtime: CacheRuntime, owner: Mapping[str, Any],
                 settings: Settings, event: str = "") -> dict[str, Any]:
    """``NAME-dataload`` running ``datacache warmup DATASET [PATH ...]`` (3 retries): a Job for
    policy Once, a CronJob on ``spec.schedule`` for policy Cron (one run at a time). Policy OnEvent:
    a Job for the metadata sync ``event`` (annotation :data:`SYNC_EVENT_ANNOTATION`, the time the
    Dataset's sync Job found added or changed files under the targets, see :mod:`.syncjob`),
    recorded on the Job so that the next event starts a new run."""
    name, namespace = dataload.metadata.name, dataload.metadata.namespace
    volumes, mounts = base_volumes(runtime)
    secret_vols, secret_mounts = secret_volumes(dataset)
    traces = [f"--from-trace={t.trace}" for t in dataload.spec.target if t.trace is not None][:1]  # one per run
    warmup = ["datacache", "warmup", dataset.metadata.name, *[t.path for t in dataload.spec.target if t.path],
              *traces, "-q", "-n", dataset.metadata.namespace]
    labels = {"app.kubernetes.io/name": "datacache", "app.kubernetes.io/component": "dataload",
              "datacache.io/dataload": name}
    container = {"name": "warmup", "image": settings.image, "command": shell(_apply(), warmup),
                 "env": pod_env(runtime, settings), "securityContext": RESTRICTED, "volumeMounts": mounts + secret_mounts}
    if runtime.kind == "JuiceFSRuntime":  # juicefs warmup goes through a client mounted in the Job's pod
        juicefs_client(container, volumes, runtime, settings)
    spec = job_spec(labels, container, volumes + secret_vols)
    meta = child_meta(f"{name}-dataload", namespace, labels, owner)
    if dataload.spec.policy == "Cron":
        return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": meta, "spec": {
            "schedule": dataload.spec.schedule, "concurrencyPolicy": "Forbid",
            "jobTemplate": {"metadata": {"labels": labels}, "spec": spec}}}
    if event:
        meta["annotations"] = {SYNC_EVENT_ANNOTATION: event}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec}


def cron_status(cron_status: Mapping[str, Any] | None) -> dict[str, Any]:
    """A Cron DataLoad's status from its CronJob's ``status``: Executing while a run is active
    (else Pending: waiting for the schedule), and the last schedule and success times."""
    status = cron_status or {}
    out: dict[str, Any] = {"phase": "Executing" if status.get("active") else "Pending"}
    for key in ("lastScheduleTime", "lastSuccessfulTime"):
        if status.get(key):
            out[key] = status[key]
    return out


def job_phase(job_status: Mapping[str, Any] | None) -> str:
    """A DataLoad phase from its Job's ``status``: Complete, Failed, Executing or Pending."""
    status = job_status or {}
    for condition in status.get("conditions") or []:
        if condition.get("status") == "True" and condition.get("type") in ("Complete", "Failed"):
            return condition["type"]
    if status.get("succeeded"):
        return "Complete"
    return "Executing" if status.get("active") else "Pending"

