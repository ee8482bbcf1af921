"""ThinRuntime on Kubernetes: the operator reconciles it on the CacheRuntime's path (ConfigMap with
the profile, token, headless Service, worker StatefulSet, status); the worker pod's own command
reads the UFS through the profile's plugin (a real worker process, a real entry point); a missing
profile or plugin is phase Failed with the reason, and recovers once the profile exists. An OnEvent
DataLoad waits for a metadata sync's mark, then runs one warmup Job per mark."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import time
import urllib.request

import pytest
import yaml

from datacache.api.loader import load_resources
from datacache.cluster.worker_client import WorkerClient
from datacache.control.embedded import Embedded
from datacache_operator import manifests
from datacache_operator.settings import Settings
from operator_schemas import validate
from test_operator_kmock import NS, _get, _resource, _wait, cluster, run_operator  # noqa: F401  (the fixture)
from test_operator_workers import _free_port, _metrics, _start_worker

CRS = "datacache.io/v1alpha1"
PLUGIN = '''
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem


class TeamFS(DirFileSystem):
    protocol = "teamfs"


def open_teamfs(url, options, secret_files):
    return TeamFS(path=options["root"], fs=LocalFileSystem())
'''


def _mark(kmock, event):
    """What the Dataset's sync Job does to an OnEvent DataLoad whose targets changed: a merge patch
    of its annotation through the API (so the operator's watch sees it)."""
    request = urllib.request.Request(f"{kmock.url}/apis/{CRS}/namespaces/{NS}/dataloads/on-change", method="PATCH",
                                     data=json.dumps({"metadata": {"annotations": {"datacache.io/sync-event": event}}}).encode(),
                                     headers={"Content-Type": "application/merge-patch+json"})
    urllib.request.urlopen(request, timeout=10).close()


def _profile(plugin=None, fuse=None):
    spec = {"fileSystemType": "teamfs", **({"plugin": plugin} if plugin else {}), **({"fuse": fuse} if fuse else {})}
    return {"apiVersion": CRS, "kind": "ThinRuntimeProfile", "metadata": {"name": "teamfs"}, "spec": spec}


def _thin(port=7700, root="/srv/team"):
    text = f"""
apiVersion: {CRS}
kind: Dataset
metadata: {{name: imagenet, namespace: {NS}}}
spec:
  mounts: [{{name: images, mountPoint: "teamfs://images"}}]
---
apiVersion: {CRS}
kind: ThinRuntime
metadata: {{name: imagenet, namespace: {NS}}}
spec:
  profileName: teamfs
  options: {{root: "{root}"}}
  blockSize: 64Ki
  worker: {{port: {port}}}
  tieredstore: {{levels: [{{mediumtype: SSD, path: cache, quota: 64Mi}}]}}
"""
    return text, load_resources("thin.yaml", yaml.safe_dump(_profile(plugin="teamfs")) + "---\n" + text)


def _owner(kind="ThinRuntime"):
    return {"apiVersion": CRS, "kind": kind, "metadata": {"name": "imagenet", "uid": "22222222-0000-0000-0000-000000000001"}}


@pytest.fixture
def teamfs(tmp_path, monkeypatch):
    """Plugin ``teamfs`` installed as a real entry point (module + dist-info) for this process and
    for the worker processes (PYTHONPATH); yields the plugin's root directory with the files."""
    site = tmp_path / "site"
    (site / "teamfs_example-0.1.dist-info").mkdir(parents=True)
    (site / "teamfs_example.py").write_text(PLUGIN)
    (site / "teamfs_example-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: teamfs-example\nVersion: 0.1\n")
    (site / "teamfs_example-0.1.dist-info" / "entry_points.txt").write_text(
        "[datacache.runtimes]\nteamfs = teamfs_example:open_teamfs\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", str(site))
    root = tmp_path / "store"
    (root / "images" / "n01").mkdir(parents=True)
    files = {"n01/a.jpg": os.urandom(150_000), "n01/b.jpg": os.urandom(10)}
    for path, data in files.items():
        (root / "images" / path).write_bytes(data)
    return root, files


def test_thin_runtime_children_are_valid_and_carry_the_profile():
    _, (profile, dataset, runtime) = _thin()
    owner = {**_owner(), "metadata": {**_owner()["metadata"], "namespace": NS}}
    cm = manifests.config_map(dataset, runtime, owner, profile)
    loaded = load_resources("resources.yaml", cm["data"]["resources.yaml"])
    assert [r.kind for r in loaded] == ["ThinRuntimeProfile", "Dataset", "ThinRuntime"]
    assert loaded[0].spec.plugin == "teamfs" and loaded[2].spec.options == {"root": "/srv/team"}
    # a ThinRuntime (replicas 0 or 1) is a StatefulSet whatever the operator's worker kind
    for settings in (Settings(), Settings(worker_kind="DaemonSet")):
        sts = manifests.worker_workload(dataset, runtime, owner, settings, profile)
        assert (sts["kind"], sts["spec"]["replicas"]) == ("StatefulSet", 1)
        for obj in (cm, manifests.headless_service(runtime, owner), sts):
            validate(obj)
        (container,) = sts["spec"]["template"]["spec"]["containers"]
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}  # a plugin needs no privilege
    # a FUSE command mounts inside the worker: /dev/fuse and privileges, for that container only
    fuse = load_resources("p.yaml", yaml.safe_dump(_profile(fuse={"command": ["teamfs-mount", "$(DATACACHE_THIN_TARGET)"]})))[0]
    for settings, device in ((Settings(), None), (Settings(fuse_device_resource="smarter-devices/fuse"), "smarter-devices/fuse")):
        sts = manifests.worker_workload(dataset, runtime, owner, settings, fuse)
        validate(sts)
        pod = sts["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["securityContext"] == {"privileged": True, "runAsUser": 0, "runAsNonRoot": False}
        if device:
            assert container["resources"]["limits"] == {device: "1"} and "requests" in container["resources"]
            assert not any(m["mountPath"] == "/dev/fuse" for m in container["volumeMounts"])
        else:
            assert {"name": "dev-fuse", "hostPath": {"path": "/dev/fuse", "type": "CharDevice"}} in pod["volumes"]
            assert {"name": "dev-fuse", "mountPath": "/dev/fuse"} in container["volumeMounts"]


def test_thin_runtime_worker_reads_through_the_plugin(teamfs, tmp_path):
    root, files = teamfs
    port = _free_port()
    _, (profile, dataset, runtime) = _thin(port, str(root))
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "resources.yaml").write_text(manifests.config_map(dataset, runtime, _owner(), profile)["data"]["resources.yaml"])
    command = manifests.worker_workload(dataset, runtime, _owner(), Settings(), profile)["spec"]["template"]["spec"]["containers"][0]["command"]
    token = "tok-" + "t" * 40
    proc = _start_worker(command, conf, tmp_path / "home-0", 0, token)
    url = f"http://127.0.0.2:{port}"
    try:
        deadline = time.monotonic() + 60
        while "datacache_worker_total_capacity_bytes" not in _metrics(url):
            assert proc.poll() is None, f"worker exited: {proc.stderr.read().decode()[-2000:]}"
            assert time.monotonic() < deadline, f"worker did not answer on {url}"
            time.sleep(0.2)
        # the same manifest the pod's plane made (listing through the plugin), made here
        plane = Embedded(str(tmp_path / "reader"))
        plane.apply([profile, dataset, runtime])
        manifest = plane.load_manifest(plane.get("Dataset", "imagenet", NS))
        plane.close()
        entry = manifest.lookup("n01/a.jpg")

        client = WorkerClient(token, "imagenet", runtime.spec.block_size_bytes)
        try:
            blocks = [client.get_block(url, "worker-0", entry, i) for i in range(-(-entry.size // (64 << 10)))]
        finally:
            asyncio.run(client.close())
        data, hits = b"".join(data for data, _ in blocks), [hit for _, hit in blocks]
        assert hashlib.sha256(data).hexdigest() == hashlib.sha256(files["n01/a.jpg"]).hexdigest()
        assert hits == [False, False, False]  # 150,000 bytes = 3 blocks of 64 KiB, filled from the plugin
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)


def test_operator_reconciles_a_thin_runtime(cluster):  # noqa: F811
    kmock, _ = cluster
    kmock.objects[f"{CRS}/datasets", NS, "imagenet"] = _resource("Dataset", "imagenet", {
        "mounts": [{"name": "images", "mountPoint": "sftp://team@files.example.com/images"}]})
    kmock.objects[f"{CRS}/thinruntimes", NS, "imagenet"] = _resource("ThinRuntime", "imagenet", {
        "profileName": "sftp-team", "tieredstore": {"levels": [{"mediumtype": "SSD", "path": "cache", "quota": "1Gi"}]}},
        uid="22222222-0000-0000-0000-000000000002")
    kmock.objects[f"{CRS}/thinruntimes", NS, "nosuch"] = _resource("ThinRuntime", "nosuch", {
        "profileName": "nosuch-plugin", "tieredstore": {"levels": [{"mediumtype": "MEM", "quota": "1Gi"}]}},
        uid="22222222-0000-0000-0000-000000000003")
    kmock.objects[f"{CRS}/datasets", NS, "nosuch"] = _resource("Dataset", "nosuch", {
        "mounts": [{"name": "m", "mountPoint": "/data"}]}, uid="22222222-0000-0000-0000-000000000004")
    kmock.objects[f"{CRS}/thinruntimeprofiles", None, "nosuch-plugin"] = {
        **_profile(plugin="nosuch"), "metadata": {"name": "nosuch-plugin", "uid": "p-1", "resourceVersion": "1"}}

    for name, policy, uid in (("warm", "Once", "5"), ("on-change", "OnEvent", "6")):
        kmock.objects[f"{CRS}/dataloads", NS, name] = _resource("DataLoad", name, {
            "dataset": {"name": "imagenet", "namespace": NS}, "target": [{"path": "/n01"}], "policy": policy},
            uid=f"22222222-0000-0000-0000-00000000000{uid}")

    with run_operator() as runner:
        # a DataLoad of a ThinRuntime's Dataset is a Job like any other
        job = _wait(lambda: _get(kmock, "batch/v1/jobs", "warm-dataload"))
        validate(job)
        assert "exec datacache warmup imagenet /n01 -q -n ml" in job["spec"]["template"]["spec"]["containers"][0]["command"][2]

        # OnEvent is accepted: Pending, and no Job, until a metadata sync's diff touches its targets
        assert _wait(lambda: _get(kmock, f"{CRS}/dataloads", "on-change").get("status", {}).get("phase")) == "Pending"
        assert ("batch/v1/jobs", NS, "on-change-dataload") not in kmock.objects
        # the Dataset's sync Job marks it (datacache sync --report-status kubernetes): a warmup Job runs
        first, second = "2026-11-30T01:00:00Z", "2026-11-30T01:10:00Z"
        _mark(kmock, first)
        job = _wait(lambda: _get(kmock, "batch/v1/jobs", "on-change-dataload"))
        validate(job)
        assert job["metadata"]["annotations"] == {"datacache.io/sync-event": first}
        assert job["spec"]["template"]["spec"]["containers"][0]["command"][2].endswith(
            "exec datacache warmup imagenet /n01 -q -n ml")
        kmock.objects["batch/v1/jobs", NS, "on-change-dataload"].patch({"status": {"active": 1}})
        _wait(lambda: _get(kmock, f"{CRS}/dataloads", "on-change")["status"]["phase"] == "Executing")
        # a newer sync while that run goes: the new run waits for it, then replaces its Job
        _mark(kmock, second)
        time.sleep(1.5)  # three retries of the handler
        assert _get(kmock, "batch/v1/jobs", "on-change-dataload")["metadata"]["annotations"] == {
            "datacache.io/sync-event": first}
        kmock.objects["batch/v1/jobs", NS, "on-change-dataload"].patch({"status": {
            "active": 0, "succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}})

        def second_run():
            """the warmup Job of the second sync event"""
            job = _get(kmock, "batch/v1/jobs", "on-change-dataload")
            return job["metadata"]["annotations"]["datacache.io/sync-event"] == second and job
        assert "status" not in _wait(second_run)  # a new Job, not the finished one
        _wait(lambda: _get(kmock, f"{CRS}/dataloads", "on-change")["status"]["phase"] == "Pending")

        def failed(name):
            def check():
                """the ThinRuntime's Failed status"""
                status = _get(kmock, f"{CRS}/thinruntimes", name).get("status", {})
                return status.get("phase") == "Failed" and status
            return check
        status = _wait(failed("imagenet"))
        assert (status["conditions"][0]["reason"], status["conditions"][0]["message"]) == (
            "RuntimeFailed", "thinruntime ml/imagenet: spec.profileName: thinruntimeprofile 'sftp-team' not found: "
                             "apply it first")
        status = _wait(failed("nosuch"))
        assert status["conditions"][0]["message"] == (
            "thinruntime ml/nosuch: plugin 'nosuch' is not installed in image datacache:test (no entry point in "
            "group 'datacache.runtimes'): build the image with the plugin's package")
        assert ("apps/v1/statefulsets", NS, "imagenet-worker") not in kmock.objects

        # the profile appears (sftp: a plugin the image ships): the runtime's children follow
        kmock.objects[f"{CRS}/thinruntimeprofiles", None, "sftp-team"] = {
            **_profile(plugin="sftp"), "metadata": {"name": "sftp-team", "uid": "p-2", "resourceVersion": "1"}}
        sts = _wait(lambda: _get(kmock, "apps/v1/statefulsets", "imagenet-worker"), timeout=30)
        children = [sts, _get(kmock, "v1/services", "imagenet-worker"), _get(kmock, "v1/configmaps", "imagenet-config"),
                    _get(kmock, "v1/secrets", "imagenet-worker-token")]
        for child in children:
            validate(child)
            assert child["metadata"]["ownerReferences"][0] == {
                "apiVersion": CRS, "kind": "ThinRuntime", "name": "imagenet", "uid": "22222222-0000-0000-0000-000000000002",
                "controller": True, "blockOwnerDeletion": True}
        assert sts["spec"]["replicas"] == 1
        kinds = [d["kind"] for d in yaml.safe_load_all(children[2]["data"]["resources.yaml"])]
        assert kinds == ["ThinRuntimeProfile", "Dataset", "ThinRuntime"]

        def not_ready():
            """the ThinRuntime's status waiting for its worker"""
            status = _get(kmock, f"{CRS}/thinruntimes", "imagenet").get("status", {})
            return status.get("phase") == "NotReady" and status
        status = _wait(not_ready, timeout=30)
        assert (status["desiredWorkers"], status["readyWorkers"]) == (1, 0)

        def bound():
            """the Dataset bound to its ThinRuntime"""
            return _get(kmock, f"{CRS}/datasets", "imagenet").get("status", {}).get("phase") == "Pending"
        _wait(bound)
    assert runner.exception is None
    assert "Traceback" not in runner.output
