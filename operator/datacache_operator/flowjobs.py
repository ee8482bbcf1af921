"""Jobs of the data-flow kinds, as plain dicts (pure functions, no API calls).

A DataMigrate ``NAME`` becomes ConfigMap ``NAME-migrate`` (``resources.yaml``: the Dataset it
copies from or into, and the DataMigrate itself without ``runAfter``: the operator has already
waited) and Job ``NAME-migrate`` running ``datacache apply`` on it in a pod of its own (a CronJob
for policy Cron): the embedded engine copies, resumably, and exits non-zero when a file failed.
The Secrets named by the Dataset's and the external store's encryptOptions are mounted as files,
as for workers. A DataProcess ``NAME`` becomes Job ``NAME-process`` running the user's command in
``spec.image`` (default: datacache's); its pod is labelled ``datacache.io/dataset`` and annotated
with the mount path, so the admission webhook gives it the dataset's FUSE sidecar like any
training pod. Neither pod gets a ServiceAccount token: they never call the API.
``ttlSecondsAfterFinished`` goes to the Job (Kubernetes removes the finished Job and its pods).
"""

from __future__ import annotations

import posixpath
from typing import Any, Mapping

from datacache.api.dataflow import DataMigrate, DataProcess
from datacache.api.loader import to_yaml
from datacache.api.models import Dataset

from .manifests import DATASET_LABEL, RESTRICTED, child_meta, job_spec, secret_volumes, shell
from .settings import CONFIG_DIR, HOME, Settings
from .webhook import MOUNT_PATH_ANNOTATION


def _labels(component: str, kind: str, name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "datacache", "app.kubernetes.io/component": component,
            f"datacache.io/{kind}": name}


def migrate_config_map(dm: DataMigrate, dataset: Dataset, owner: Mapping[str, Any]) -> dict[str, Any]:
    """ConfigMap ``NAME-migrate``: the Dataset and the DataMigrate (``runAfter`` dropped)."""
    alone = dm.model_copy(update={"spec": dm.spec.model_copy(update={"run_after": None})})
    name = dm.metadata.name
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": child_meta(f"{name}-migrate", dm.metadata.namespace, _labels("datamigrate", "datamigrate",
                                                                                      name), owner),
            "data": {"resources.yaml": to_yaml([dataset, alone])}}


def migrate_job(dm: DataMigrate, dataset: Dataset, owner: Mapping[str, Any], settings: Settings) -> dict[str, Any]:
    """Job ``NAME-migrate`` (CronJob for policy Cron): ``datacache apply`` of the ConfigMap, with
    ``parallelism`` copies at once inside the one pod."""
    name = dm.metadata.name
    labels = _labels("datamigrate", "datamigrate", name)
    external = [side.external_storage.as_mount() for side in (dm.spec.from_, dm.spec.to) if side.external_storage]
    secret_vols, secret_mounts = secret_volumes(dataset, *external)
    volumes = [{"name": "home", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}},
               {"name": "config", "configMap": {"name": f"{name}-migrate"}}]
    mounts = [{"name": "home", "mountPath": HOME}, {"name": "tmp", "mountPath": "/tmp"},
              {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}]
    container = {"name": "migrate", "image": settings.image,
                 "command": shell(["datacache", "apply", "-f", posixpath.join(CONFIG_DIR, "resources.yaml")]),
                 "env": [{"name": "DATACACHE_HOME", "value": HOME}], "securityContext": RESTRICTED,
                 "volumeMounts": mounts + secret_mounts}
    spec = job_spec(labels, container, volumes + secret_vols)
    return _job_or_cron(dm, labels, spec, owner)


def process_job(dp: DataProcess, owner: Mapping[str, Any], settings: Settings) -> dict[str, Any]:
    """Job ``NAME-process``: ``command`` + ``args`` with ``DATACACHE_DATASET_PATH`` set to
    ``mountPath``, where the webhook's FUSE sidecar mounts the dataset (read-only)."""
    name, spec = dp.metadata.name, dp.spec
    labels = {**_labels("dataprocess", "dataprocess", name), DATASET_LABEL: spec.dataset.name}
    container = {"name": "process", "image": spec.image or settings.image, "command": list(spec.command),
                 "args": list(spec.args),
                 "env": [{"name": v.name, "value": v.value} for v in spec.env]
                 + [{"name": "DATACACHE_DATASET_PATH", "value": spec.mount_path}],
                 "securityContext": RESTRICTED}
    job = job_spec(labels, container, [{"name": "tmp", "emptyDir": {}}])
    container["volumeMounts"] = [{"name": "tmp", "mountPath": "/tmp"}]
    job["template"]["metadata"]["annotations"] = {MOUNT_PATH_ANNOTATION: spec.mount_path}
    return _job_or_cron(dp, labels, job, owner)


def _job_or_cron(res, labels: dict[str, str], spec: dict[str, Any], owner: Mapping[str, Any]) -> dict[str, Any]:
    suffix = "migrate" if res.kind == "DataMigrate" else "process"
    meta = child_meta(f"{res.metadata.name}-{suffix}", res.metadata.namespace, labels, owner)
    if getattr(res.spec, "policy", "Once") == "Cron":
        return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": meta, "spec": {
            "schedule": res.spec.schedule, "concurrencyPolicy": "Forbid",
            "jobTemplate": {"metadata": {"labels": labels}, "spec": spec}}}
    if res.spec.ttl_seconds_after_finished is not None:
        spec["ttlSecondsAfterFinished"] = res.spec.ttl_seconds_after_finished
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec}
