"""A Dataset's metadata sync on Kubernetes: Job ``NAME-sync`` and what it needs (pure functions).

Fluid's runtime master lists the UFS and its operator writes ``ufsTotal`` into the Dataset; here the
operator creates, for each Dataset bound to a runtime, all owned by the Dataset:

- PersistentVolumeClaim ``NAME-metadata`` (ReadWriteOnce, ``settings.sync_volume_size``): the
  previous manifest, the diff and the sync marks live there between runs, so each sync diffs
  against the last one (OnEvent DataLoads need that diff). Why a claim: a Job's emptyDir dies with
  its pod, and the workers' volumes are emptyDirs or hostPaths on other nodes, out of a Job's
  reach; a claim is the one Kubernetes volume that outlives pods and follows them across nodes, it
  needs nothing of the runtime (scale, worker kind), and one writer at a time is all it serves
  (one sync Job per Dataset at a time), so ReadWriteOnce on the default StorageClass suffices.
  It is mounted at ``$DATACACHE_HOME/datasets/<namespace>`` (where the embedded plane keeps the
  manifest under ``<name>/``): the pod creates ``<name>/`` itself with mode 0700, which it could
  not do to a volume's root.
- ServiceAccount ``NAME-sync`` and RoleBinding ``NAME-sync`` to the chart's ClusterRole
  (``settings.sync_cluster_role``: get/patch ``datasets/status``, get/list/patch ``dataloads``):
  a RoleBinding confines it to the Dataset's namespace; no Secret is readable.
- Job ``NAME-sync`` running ``datacache sync NAME -f resources.yaml --report-status kubernetes``
  (see :mod:`datacache.control.kubestatus`), with the runtime's ConfigMap, DNS membership and
  worker token as every datacache pod, the Dataset's Secrets as files.

When it runs: the operator's Dataset handler (on create, on spec change and on its status timer)
creates the Job when there is none, and re-creates it when the last one finished and either the
Dataset's spec changed since (``metadata.generation``) or ``spec.autoSyncInterval`` seconds have
passed since it finished. Why the operator's timer and not a CronJob: ``autoSyncInterval`` is in
seconds (a cron schedule cannot say "every 90 s" or "every 7 min" evenly), a spec change must
sync at once, and the next run is counted from the end of the last one, as embedded does
(``datacache controller``), so slow listings never pile up.
"""

from __future__ import annotations

import posixpath
from datetime import datetime
from typing import Any, Mapping

from datacache.api.models import CacheRuntime, Dataset

from .manifests import RESTRICTED, base_volumes, child_meta, job_phase, job_spec, pod_env, secret_volumes, shell
from .settings import CONFIG_DIR, HOME, Settings

GENERATION_ANNOTATION = "datacache.io/dataset-generation"
"""On the sync Job: the Dataset's ``metadata.generation`` it synced (a newer one re-runs it)."""


def names(dataset: Dataset) -> dict[str, str]:
    """Names of a Dataset's sync objects: ``job`` and ``account`` (ServiceAccount and RoleBinding)
    ``NAME-sync``, ``claim`` ``NAME-metadata``."""
    name = dataset.metadata.name
    return {"job": f"{name}-sync", "account": f"{name}-sync", "claim": f"{name}-metadata"}


def _labels(dataset: Dataset) -> dict[str, str]:
    return {"app.kubernetes.io/name": "datacache", "app.kubernetes.io/component": "metadata-sync",
            "datacache.io/dataset": dataset.metadata.name}


def metadata_claim(dataset: Dataset, owner: Mapping[str, Any], settings: Settings) -> dict[str, Any]:
    """PersistentVolumeClaim ``NAME-metadata`` keeping the Dataset's manifest between syncs."""
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": settings.sync_volume_size}}}
    if settings.sync_storage_class:
        spec["storageClassName"] = settings.sync_storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": child_meta(names(dataset)["claim"], dataset.metadata.namespace, _labels(dataset), owner),
            "spec": spec}


def service_account(dataset: Dataset, owner: Mapping[str, Any]) -> dict[str, Any]:
    """ServiceAccount ``NAME-sync`` of the sync pods."""
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": child_meta(names(dataset)["account"], dataset.metadata.namespace, _labels(dataset), owner)}


def role_binding(dataset: Dataset, owner: Mapping[str, Any], settings: Settings) -> dict[str, Any]:
    """RoleBinding ``NAME-sync``: the sync ServiceAccount gets ``settings.sync_cluster_role`` in
    the Dataset's namespace only."""
    account, namespace = names(dataset)["account"], dataset.metadata.namespace
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": child_meta(account, namespace, _labels(dataset), owner),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": settings.sync_cluster_role},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]}


def sync_job(dataset: Dataset, runtime: CacheRuntime, owner: Mapping[str, Any], settings: Settings,
             generation: int) -> dict[str, Any]:
    """Job ``NAME-sync``: one metadata sync of ``dataset`` (at spec ``generation``) reported into
    its status, the previous manifest on claim ``NAME-metadata``."""
    name, namespace = dataset.metadata.name, dataset.metadata.namespace
    own = names(dataset)
    volumes, mounts = base_volumes(runtime)
    secret_vols, secret_mounts = secret_volumes(dataset)
    volumes.append({"name": "metadata", "persistentVolumeClaim": {"claimName": own["claim"]}})
    mounts.append({"name": "metadata", "mountPath": posixpath.join(HOME, "datasets", namespace)})
    command = ["datacache", "sync", name, "-n", namespace, "-f", posixpath.join(CONFIG_DIR, "resources.yaml"),
               "--report-status", "kubernetes"]
    container = {"name": "sync", "image": settings.image, "command": shell(command),
                 "env": pod_env(runtime, settings), "securityContext": RESTRICTED,
                 "volumeMounts": mounts + secret_mounts}
    meta = child_meta(own["job"], namespace, _labels(dataset), owner)
    meta["annotations"] = {GENERATION_ANNOTATION: str(generation)}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
            "spec": job_spec(_labels(dataset), container, volumes + secret_vols,
                             serviceAccountName=own["account"], automountServiceAccountToken=True)}


def finished_at(job_status: Mapping[str, Any] | None) -> float | None:
    """When a Job finished (epoch seconds): its ``completionTime``, or the time its Complete or
    Failed condition became true; None while it has not."""
    status = job_status or {}
    stamps = [status.get("completionTime")] + [
        c.get("lastTransitionTime") for c in status.get("conditions") or []
        if c.get("status") == "True" and c.get("type") in ("Complete", "Failed")]
    times = [datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp() for s in stamps if s]
    return max(times) if times else None


def sync_due(job: Mapping[str, Any] | None, generation: int, interval_s: int | None, now: float) -> bool:
    """Whether a new sync Job should replace ``job`` (the current one, or None) at ``now`` (epoch
    seconds): none yet; or it finished and the Dataset's spec ``generation`` is newer than the one
    it synced, or ``interval_s`` (``spec.autoSyncInterval``; None or 0: never) have passed since."""
    if job is None:
        return True
    if job_phase(job.get("status")) in ("Pending", "Executing"):
        return False
    synced = ((job.get("metadata") or {}).get("annotations") or {}).get(GENERATION_ANNOTATION)
    if synced != str(generation):
        return True
    done = finished_at(job.get("status"))
    return bool(interval_s) and done is not None and now - done >= interval_s


def sync_state(job: Mapping[str, Any] | None) -> tuple[bool, str]:
    """``(updating, sync_error)`` of a Dataset from its sync Job: running (its pod started: the
    Dataset is Updating), or failed (why, and where to look)."""
    if job is None:
        return False, ""
    phase = job_phase(job.get("status"))
    if phase == "Failed":
        meta = job["metadata"]
        return False, (f"metadata sync Job {meta['namespace']}/{meta['name']} failed: see kubectl logs "
                       f"-n {meta['namespace']} job/{meta['name']}")
    return phase == "Executing", ""
