"""A Dataset's metadata-sync objects (Job, manifest claim, ServiceAccount, RoleBinding) are valid
for a current Kubernetes release, carry the secrets as files only, and re-run when due."""

from __future__ import annotations

import yaml

from datacache_operator import syncjob
from datacache_operator.settings import HOME, Settings
from operator_schemas import validate
from test_manifests import _load, _owner

T0 = 1_796_000_000.0  # 2026-11-30T00:53:20Z


def _objects(settings=Settings()):
    dataset, runtime, _ = _load()
    owner = _owner(dataset)
    return (syncjob.metadata_claim(dataset, owner, settings), syncjob.service_account(dataset, owner),
            syncjob.role_binding(dataset, owner, settings), syncjob.sync_job(dataset, runtime, owner, settings, 3))


def test_sync_objects_are_valid_and_owned_by_the_dataset():
    for obj in _objects(Settings(sync_storage_class="fast-ssd", sync_volume_size="5Gi")):
        validate(obj)
        (ref,) = obj["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["controller"]) == ("Dataset", "imagenet", True)
        assert obj["metadata"]["namespace"] == "ml"
    claim, account, binding, job = _objects(Settings(sync_storage_class="fast-ssd", sync_volume_size="5Gi"))
    assert claim["metadata"]["name"] == "imagenet-metadata"
    assert claim["spec"] == {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast-ssd",
                             "resources": {"requests": {"storage": "5Gi"}}}
    assert "storageClassName" not in _objects()[0]["spec"]  # the cluster's default StorageClass
    assert account["metadata"]["name"] == binding["metadata"]["name"] == "imagenet-sync"
    # the chart's ClusterRole, granted in the Dataset's namespace only (a RoleBinding)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "datacache-sync"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "imagenet-sync", "namespace": "ml"}]
    assert job["metadata"]["annotations"] == {"datacache.io/dataset-generation": "3"}


def test_sync_job_runs_the_sync_command_with_claim_secrets_and_account():
    *_, job = _objects()
    pod = job["spec"]["template"]["spec"]
    assert (pod["serviceAccountName"], pod["automountServiceAccountToken"]) == ("imagenet-sync", True)
    assert pod["securityContext"]["fsGroup"] == 10001  # the claim is writable by the image's user
    (container,) = pod["containers"]
    assert container["command"] == ["sh", "-c", "exec datacache sync imagenet -n ml -f /etc/datacache/resources.yaml "
                                                "--report-status kubernetes"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert volumes["metadata"]["persistentVolumeClaim"] == {"claimName": "imagenet-metadata"}
    # the plane keeps the manifest in $DATACACHE_HOME/datasets/<ns>/<name>/: <name>/ is made (0700) on the claim
    assert mounts["metadata"]["mountPath"] == f"{HOME}/datasets/ml"
    assert volumes["config"]["configMap"] == {"name": "imagenet-config"}
    assert volumes["secret-0"]["secret"]["secretName"] == "s3-creds"
    assert mounts["secret-0"] == {"name": "secret-0", "mountPath": f"{HOME}/secrets/s3-creds", "readOnly": True}
    for env in container["env"]:  # the worker token by reference, no secret value in the spec
        assert "value" not in env or env["name"] in ("DATACACHE_HOME", "DATACACHE_MEMBERSHIP", "DATACACHE_CLUSTER_DOMAIN")
    assert {"name": "DATACACHE_WORKER_TOKEN", "valueFrom": {"secretKeyRef": {
        "name": "imagenet-worker-token", "key": "token"}}} in container["env"]
    assert "secretKeyRef" not in yaml.safe_dump(pod["volumes"])


def _job(status, generation=3):
    return {"metadata": {"name": "imagenet-sync", "namespace": "ml",
                         "annotations": {"datacache.io/dataset-generation": str(generation)}}, "status": status}


def test_sync_is_due_on_first_bind_spec_change_and_interval():
    done = {"succeeded": 1, "completionTime": "2026-11-30T00:53:20Z",
            "conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": "2026-11-30T00:53:20Z"}]}
    assert syncjob.finished_at(done) == T0
    assert syncjob.finished_at({"active": 1}) is None
    assert syncjob.sync_due(None, 1, None, T0)  # bound: the first sync
    assert not syncjob.sync_due(_job({"active": 1}, generation=2), 3, 60, T0 + 3600)  # one at a time
    assert syncjob.sync_due(_job(done, generation=2), 3, None, T0 + 1)  # the spec changed since
    assert not syncjob.sync_due(_job(done), 3, None, T0 + 10**6)  # no autoSyncInterval: once
    assert not syncjob.sync_due(_job(done), 3, 0, T0 + 10**6)
    assert not syncjob.sync_due(_job(done), 3, 600, T0 + 599)
    assert syncjob.sync_due(_job(done), 3, 600, T0 + 600)  # counted from the end of the last run
    failed = {"failed": 4, "conditions": [{"type": "Failed", "status": "True", "lastTransitionTime": "2026-11-30T00:53:20Z"}]}
    assert syncjob.sync_due(_job(failed), 3, 600, T0 + 600)


def test_dataset_state_follows_its_sync_job():
    assert syncjob.sync_state(None) == (False, "")
    assert syncjob.sync_state(_job({})) == (False, "")  # created, no pod yet
    assert syncjob.sync_state(_job({"active": 1})) == (True, "")
    assert syncjob.sync_state(_job({"failed": 4, "conditions": [{"type": "Failed", "status": "True"}]})) == (
        False, "metadata sync Job ml/imagenet-sync failed: see kubectl logs -n ml job/imagenet-sync")
