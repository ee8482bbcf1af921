"""Data flows on Kubernetes: the real operator (KopfRunner) against kmock creates the Jobs of a
DataMigrate -> DataProcess -> DataLoad chain in runAfter order, each only once its predecessor's
Job completed, with status from the Jobs; a failed Job stops the chain with its reason. The Jobs
are checked against the Kubernetes schemas."""

from __future__ import annotations

from operator_schemas import validate
from test_operator_kmock import (NS, _get, _resource, _wait, admission_review, cluster,  # noqa: F401 (fixture)
                                 run_operator)

CRS = "datacache.io/v1alpha1"
S3 = {"uri": "s3://bucket/raw", "options": {"endpoint_url": "http://s3.example:9000"}, "encryptOptions": [
    {"name": "secret", "valueFrom": {"secretKeyRef": {"name": "s3-creds", "key": "secret-key"}}}]}


def _uid(n: int) -> str:
    return f"22222222-0000-0000-0000-{n:012d}"


def _phase(kmock, plural: str, name: str) -> str:
    return (_get(kmock, f"{CRS}/{plural}", name).get("status") or {}).get("phase", "")


def _finish(kmock, job: str, ok: bool = True) -> None:
    condition = {"type": "Complete", "status": "True"} if ok else {
        "type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
        "message": "Job has reached the specified backoff limit", "lastTransitionTime": "2026-11-29T10:05:00Z"}
    kmock.objects["batch/v1/jobs", NS, job].patch({"status": {
        "active": 0, "succeeded": 1 if ok else 0, "failed": 0 if ok else 4, "startTime": "2026-11-29T10:00:00Z",
        "completionTime": "2026-11-29T10:01:30Z" if ok else None, "conditions": [condition]}})


def _flow(kmock, suffix: str = "") -> None:
    kmock.objects[f"{CRS}/datasets", NS, "raw"] = _resource("Dataset", "raw", {
        "mounts": [{"name": "raw", "mountPoint": "/mnt/nfs/raw"}]}, uid=_uid(1))
    kmock.objects[f"{CRS}/cacheruntimes", NS, "raw"] = _resource("CacheRuntime", "raw", {
        "tieredstore": {"levels": [{"mediumtype": "MEM", "quota": "1Gi"}]}}, uid=_uid(2))
    kmock.objects[f"{CRS}/datamigrates", NS, "fetch"] = _resource("DataMigrate", "fetch", {
        "from": {"externalStorage": S3}, "to": {"dataset": {"name": "raw"}}, "ttlSecondsAfterFinished": 600},
        uid=_uid(3))
    kmock.objects[f"{CRS}/dataprocesses", NS, "derive"] = _resource("DataProcess", "derive", {
        "dataset": {"name": "raw"}, "mountPath": "/input", "image": "python:3.12-slim",
        "command": ["python", "/code/derive.py"], "args": ["--out", "/output"],
        "env": [{"name": "MODE", "value": "fast"}], "runAfter": {"kind": "DataMigrate", "name": "fetch"}},
        uid=_uid(4))
    kmock.objects[f"{CRS}/dataloads", NS, "warm"] = _resource("DataLoad", "warm", {
        "dataset": {"name": "raw", "namespace": NS}, "runAfter": {"kind": "DataProcess", "name": "derive"}},
        uid=_uid(5))


def test_flow_jobs_start_in_order(cluster):  # noqa: F811
    kmock, _ = cluster
    _flow(kmock)
    with run_operator():
        migrate = _wait(lambda: _get(kmock, "batch/v1/jobs", "fetch-migrate"))
        validate(migrate)
        config = _get(kmock, "v1/configmaps", "fetch-migrate")
        validate(config)
        assert "runAfter" not in config["data"]["resources.yaml"] and "kind: Dataset" in config["data"]["resources.yaml"]
        pod = migrate["spec"]["template"]["spec"]
        assert migrate["metadata"]["ownerReferences"][0]["uid"] == _uid(3)
        assert migrate["spec"]["ttlSecondsAfterFinished"] == 600
        assert pod["containers"][0]["command"] == ["sh", "-c",
                                                   "exec datacache apply -f /etc/datacache/resources.yaml"]
        assert pod["automountServiceAccountToken"] is False
        secret = [v for v in pod["volumes"] if "secret" in v]
        assert secret == [{"name": "secret-0", "secret": {"secretName": "s3-creds", "defaultMode": 0o400,
                                                          "items": [{"key": "secret-key", "path": "secret-key"}]}}]
        assert "secret-key" not in str(pod["containers"][0].get("env"))

        # the later steps wait, saying for what; no Job of theirs yet
        _wait(lambda: _phase(kmock, "dataprocesses", "derive") == "Pending")
        derive = _get(kmock, f"{CRS}/dataprocesses", "derive")["status"]["conditions"][0]
        assert (derive["reason"], derive["message"]) == (
            "WaitingForPredecessor", "runAfter: waits for datamigrate ml/fetch to complete")
        _wait(lambda: _phase(kmock, "dataloads", "warm") == "Pending")
        assert ("batch/v1/jobs", NS, "derive-process") not in kmock.objects
        assert ("batch/v1/jobs", NS, "warm-dataload") not in kmock.objects

        _wait(lambda: _get(kmock, "batch/v1/jobs", "raw-sync"))  # the Dataset's first sync, before the copy
        _finish(kmock, "raw-sync")
        _finish(kmock, "fetch-migrate")
        _wait(lambda: _phase(kmock, "datamigrates", "fetch") == "Complete")
        assert _get(kmock, f"{CRS}/datamigrates", "fetch")["status"]["duration"] == "90.0s"

        def sync_deleted():
            """the finished sync Job deleted, so that the Dataset is synced again after the copy"""
            return [r for r in kmock[kmock.resource("batch/v1/jobs")] if r.method == "DELETE" and r.name == "raw-sync"]
        _wait(sync_deleted)

        process = _wait(lambda: _get(kmock, "batch/v1/jobs", "derive-process"))
        validate(process)
        template = process["spec"]["template"]
        assert template["metadata"]["labels"]["datacache.io/dataset"] == "raw"  # the webhook adds the FUSE sidecar
        assert template["metadata"]["annotations"] == {"datacache.io/mount-path": "/input"}
        container = template["spec"]["containers"][0]
        assert (container["image"], container["command"], container["args"]) == (
            "python:3.12-slim", ["python", "/code/derive.py"], ["--out", "/output"])
        assert container["env"] == [{"name": "MODE", "value": "fast"},
                                    {"name": "DATACACHE_DATASET_PATH", "value": "/input"}]
        assert ("batch/v1/jobs", NS, "warm-dataload") not in kmock.objects

        kmock.objects["v1/pods", NS, "derive-process-x7k2p"] = {
            "apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": "derive-process-x7k2p", "namespace": NS, "labels": {"job-name": "derive-process"},
                "creationTimestamp": "2026-11-29T10:02:00Z"},
            "spec": {"containers": [{"name": "process", "image": "python:3.12-slim"}]},
            "status": {"phase": "Succeeded", "containerStatuses": [{
                "name": "process", "image": "python:3.12-slim", "imageID": "", "ready": False, "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}}
        # the pod's log, as the API server serves it (plain text) for the log subresource
        kmock[f"get /api/v1/namespaces/{NS}/pods/derive-process-x7k2p/log"] << b"read 6 files\nwrote 6 files\n"
        _finish(kmock, "derive-process")
        _wait(lambda: _phase(kmock, "dataprocesses", "derive") == "Complete")
        assert _wait(lambda: "exitCode" in _get(kmock, f"{CRS}/dataprocesses", "derive")["status"])
        assert _get(kmock, f"{CRS}/dataprocesses", "derive")["status"]["exitCode"] == 0
        assert _get(kmock, f"{CRS}/dataprocesses", "derive")["status"]["logTail"] == ["read 6 files", "wrote 6 files"]
        warm = _wait(lambda: _get(kmock, "batch/v1/jobs", "warm-dataload"))
        validate(warm)


def test_failed_job_stops_the_chain_with_its_reason(cluster):  # noqa: F811
    kmock, _ = cluster
    _flow(kmock)
    with run_operator():
        _wait(lambda: _get(kmock, "batch/v1/jobs", "fetch-migrate"))
        _finish(kmock, "fetch-migrate", ok=False)
        _wait(lambda: _phase(kmock, "datamigrates", "fetch") == "Failed")
        reason = "runAfter: datamigrate ml/fetch failed: Job has reached the specified backoff limit"
        _wait(lambda: _phase(kmock, "dataprocesses", "derive") == "Failed")
        condition = _get(kmock, f"{CRS}/dataprocesses", "derive")["status"]["conditions"][0]
        assert (condition["reason"], condition["message"]) == ("PredecessorFailed", reason)
        _wait(lambda: _phase(kmock, "dataloads", "warm") == "Failed")
        condition = _get(kmock, f"{CRS}/dataloads", "warm")["status"]["conditions"][0]
        assert condition["message"] == f"runAfter: dataprocess ml/derive failed: {reason}"
        assert ("batch/v1/jobs", NS, "derive-process") not in kmock.objects
        assert ("batch/v1/jobs", NS, "warm-dataload") not in kmock.objects


def test_missing_predecessor_waits_with_reason(cluster):  # noqa: F811
    kmock, _ = cluster
    kmock.objects[f"{CRS}/datasets", NS, "raw"] = _resource("Dataset", "raw", {
        "mounts": [{"name": "raw", "mountPoint": "/mnt/nfs/raw"}]}, uid=_uid(1))
    kmock.objects[f"{CRS}/dataprocesses", NS, "orphan"] = _resource("DataProcess", "orphan", {
        "dataset": {"name": "raw"}, "mountPath": "/input", "command": ["true"],
        "runAfter": {"kind": "DataMigrate", "name": "nosuch"}}, uid=_uid(6))
    with run_operator():
        _wait(lambda: _phase(kmock, "dataprocesses", "orphan") == "Pending")
        condition = _get(kmock, f"{CRS}/dataprocesses", "orphan")["status"]["conditions"][0]
        assert (condition["reason"], condition["message"]) == (
            "PredecessorNotFound", "runAfter: datamigrate ml/nosuch not found: apply it, or fix spec.runAfter")
        assert ("batch/v1/jobs", NS, "orphan-process") not in kmock.objects


def _validate_review(obj: dict) -> dict:
    """The operator's answer to an AdmissionReview creating ``obj`` (a datacache resource)."""
    plural = {"DataLoad": "dataloads", "DataMigrate": "datamigrates", "DataProcess": "dataprocesses"}[obj["kind"]]
    return admission_review(obj, {"group": "datacache.io", "version": "v1alpha1", "kind": obj["kind"]}, plural,
                            "flow-run-after")


def test_webhook_refuses_missing_predecessor_and_cycle(cluster):  # noqa: F811
    kmock, _ = cluster
    _flow(kmock)
    with run_operator():
        orphan = _resource("DataProcess", "orphan", {"dataset": {"name": "raw"}, "mountPath": "/input",
                                                     "command": ["true"], "runAfter": {"kind": "DataMigrate",
                                                                                       "name": "nosuch"}}, uid=_uid(7))
        denied = _validate_review(orphan)
        assert denied["allowed"] is False and denied["status"]["code"] == 400
        assert denied["status"]["message"] == ("dataprocess ml/orphan: spec.runAfter: datamigrate ml/nosuch not "
                                               "found: apply it first (or in the same file), or fix spec.runAfter")
        # fetch (stored, first step) changed to wait for warm, which waits for derive, which waits for fetch
        looped = _resource("DataMigrate", "fetch", {"from": {"externalStorage": S3}, "to": {"dataset": {"name": "raw"}},
                                                    "runAfter": {"kind": "DataLoad", "name": "warm"}}, uid=_uid(3))
        denied = _validate_review(looped)
        assert denied["allowed"] is False
        assert denied["status"]["message"] == (
            "datamigrate ml/fetch: spec.runAfter makes a cycle (datamigrate ml/fetch -> dataload ml/warm -> "
            "dataprocess ml/derive -> datamigrate ml/fetch): a flow must have a first step; remove runAfter from "
            "one of them")
        fine = _resource("DataLoad", "again", {"dataset": {"name": "raw"}, "runAfter": {"kind": "DataLoad",
                                                                                        "name": "warm"}}, uid=_uid(8))
        assert _validate_review(fine)["allowed"] is True
