"""DataMigrate / DataProcess models and the runAfter graph: located one-line errors, cycles and
missing predecessors refused at apply before anything is stored."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from datacache.api.crds import crd
from datacache.api.loader import load_resources, to_document
from datacache.control.embedded import Embedded
from datacache.errors import ConfigError, ResourceError

HEADER = "apiVersion: datacache.io/v1alpha1\n"


def doc(kind: str, name: str, spec: dict) -> str:
    return json.dumps({"apiVersion": "datacache.io/v1alpha1", "kind": kind, "metadata": {"name": name},
                       "spec": spec})


def migrate(name: str, after: dict | None = None, **extra) -> str:
    spec = {"from": {"externalStorage": {"uri": "/tmp/nowhere"}}, "to": {"dataset": {"name": "raw"}}, **extra}
    if after:
        spec["runAfter"] = after
    return doc("DataMigrate", name, spec)


def errors(tmp_path, text: str) -> list[str]:
    path = tmp_path / "flow.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_resources(path)
    return str(err.value).replace(str(path), "flow.yaml").splitlines()


def test_datamigrate_round_trip_keeps_from_and_defaults(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(migrate("fetch", parallelism=8))
    dm = load_resources(path)[0]
    assert dm.spec.from_.external_storage.uri == "/tmp/nowhere"
    assert dm.spec.into_dataset and dm.spec.dataset_side.path == "/"
    assert (dm.spec.parallelism, dm.spec.overwrite, dm.spec.policy) == (8, False, "Once")
    out = to_document(dm)
    assert out["spec"]["from"] == {"externalStorage": {"uri": "/tmp/nowhere", "options": {}, "encryptOptions": []}}


def test_datamigrate_mistakes_are_located(tmp_path):
    both_datasets = doc("DataMigrate", "m", {"from": {"dataset": {"name": "a"}}, "to": {"dataset": {"name": "b"}}})
    assert errors(tmp_path, both_datasets) == [
        "flow.yaml: spec.to: one side must be a dataset and the other externalStorage (copies go between a Dataset "
        "and an external store, either way)"]
    neither = doc("DataMigrate", "m", {"from": {}, "to": {"dataset": {"name": "b"}}})
    assert errors(tmp_path, neither) == [
        "flow.yaml: spec.from: set exactly one of dataset {name, path} or externalStorage {uri}"]
    secret = doc("DataMigrate", "m", {"from": {"externalStorage": {"uri": "s3://b/p", "options": {"secret": "x"}}},
                                      "to": {"dataset": {"name": "b"}}})
    assert errors(tmp_path, secret) == [
        "flow.yaml: spec.from.externalStorage.options.secret: 'secret' is a credential: do not write it in plain "
        "text, put it in a Secret and reference it from encryptOptions (valueFrom.secretKeyRef)"]
    cron = migrate("m", policy="Cron")
    assert errors(tmp_path, cron) == [
        "flow.yaml: spec.schedule: missing required field: policy Cron needs a cron schedule, e.g. '0 3 * * *'"]
    assert errors(tmp_path, migrate("m", parallelism=0)) == ["flow.yaml: spec.parallelism: must be at least 1, got 0"]
    scheme = doc("DataMigrate", "m", {"from": {"externalStorage": {"uri": "foo://x"}}, "to": {"dataset": {"name": "b"}}})
    assert errors(tmp_path, scheme)[0].startswith("flow.yaml: spec.from.externalStorage.uri: unsupported scheme 'foo'")


def test_dataprocess_mistakes_are_located(tmp_path):
    text = doc("DataProcess", "p", {"dataset": {"name": "raw"}, "mountPath": "data", "command": "python x.py",
                                    "env": [{"name": "DATACACHE_DATASET_PATH", "value": "/x"}],
                                    "runAfter": {"kind": "Dataset", "name": "raw"}})
    assert errors(tmp_path, text) == [
        "flow.yaml: spec.mountPath: mountPath 'data' must be absolute (start with '/')",
        "flow.yaml: spec.command: 'python x.py' is a string: write the command as an argv list, one item per "
        "argument (e.g. ['python', 'x.py']); it never runs through a shell",
        "flow.yaml: spec.runAfter.kind: expected 'DataLoad', 'DataMigrate' or 'DataProcess', got 'Dataset'",
    ]
    reserved = doc("DataProcess", "p", {"dataset": {"name": "raw"}, "mountPath": "/data", "command": ["true"],
                                        "env": [{"name": "DATACACHE_DATASET_PATH", "value": "/x"}]})
    assert errors(tmp_path, reserved) == [
        "flow.yaml: spec.env[0].name: DATACACHE_DATASET_PATH is set from mountPath: remove it from env"]


def test_crds_of_flow_kinds_have_status_and_columns():
    for kind, plural in (("DataMigrate", "datamigrates"), ("DataProcess", "dataprocesses")):
        out = crd(kind)
        assert out["metadata"]["name"] == f"{plural}.datacache.io"
        version = out["spec"]["versions"][0]
        assert version["subresources"] == {"status": {}}
        spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        assert spec["runAfter"]["properties"]["kind"]["enum"] == ["DataLoad", "DataMigrate", "DataProcess"]
    assert "from" in crd("DataMigrate")["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "required"]


def apply_text(home, tmp_path, text: str, name: str = "flow.yaml"):
    path = tmp_path / name
    path.write_text(text)
    plane = Embedded(str(home))
    try:
        return plane.apply(load_resources(path))
    finally:
        plane.close()


def test_missing_predecessor_is_refused_and_nothing_stored(datacache_home, tmp_path):
    text = doc("DataLoad", "warm", {"dataset": {"name": "raw"}, "runAfter": {"kind": "DataProcess", "name": "derive"}})
    with pytest.raises(ResourceError) as err:
        apply_text(datacache_home, tmp_path, text)
    assert str(err.value) == ("dataload default/warm: spec.runAfter: dataprocess default/derive not found: apply it "
                              "first (or in the same file), or fix spec.runAfter")
    plane = Embedded(str(datacache_home))
    assert plane.state.list("DataLoad") == []
    plane.close()


def test_cycle_is_refused(datacache_home, tmp_path):
    first = migrate("a", {"kind": "DataMigrate", "name": "c"})
    second = migrate("b", {"kind": "DataMigrate", "name": "a"})
    third = migrate("c", {"kind": "DataMigrate", "name": "b"})
    with pytest.raises(ResourceError) as err:
        apply_text(datacache_home, tmp_path, "\n---\n".join([first, second, third]))
    assert str(err.value) == (
        "datamigrate default/a: spec.runAfter makes a cycle (datamigrate default/a -> datamigrate default/c -> "
        "datamigrate default/b -> datamigrate default/a): a flow must have a first step; remove runAfter from one "
        "of them")
    plane = Embedded(str(datacache_home))
    assert plane.state.list("DataMigrate") == []
    plane.close()


def test_cycle_through_a_stored_step_is_refused(datacache_home, tmp_path):
    """b waits for a (stored, waiting for nothing); changing a to wait for b closes a loop."""
    (tmp_path / "src").mkdir()
    ds = doc("Dataset", "raw", {"mounts": [{"name": "raw", "mountPoint": str(tmp_path / "raw")}]})
    (tmp_path / "raw").mkdir()
    a = doc("DataMigrate", "a", {"from": {"externalStorage": {"uri": str(tmp_path / "src")}},
                                 "to": {"dataset": {"name": "raw"}}})
    b = doc("DataMigrate", "b", {"from": {"externalStorage": {"uri": str(tmp_path / "src")}},
                                 "to": {"dataset": {"name": "raw"}}, "runAfter": {"kind": "DataMigrate", "name": "a"}})
    assert apply_text(datacache_home, tmp_path, "\n---\n".join([ds, a, b])) == [
        "dataset.datacache.io/raw created", "datamigrate.datacache.io/a created", "datamigrate.datacache.io/b created"]
    looped = doc("DataMigrate", "a", {"from": {"externalStorage": {"uri": str(tmp_path / "src")}},
                                      "to": {"dataset": {"name": "raw"}},
                                      "runAfter": {"kind": "DataMigrate", "name": "b"}})
    with pytest.raises(ResourceError, match=r"^datamigrate default/a: spec.runAfter makes a cycle \(datamigrate "
                                            r"default/a -> datamigrate default/b -> datamigrate default/a\)"):
        apply_text(datacache_home, tmp_path, looped, "again.yaml")


def test_waiting_step_fails_when_its_dataload_fails(datacache_home, tmp_path):
    """m waits for DataLoad warm (Cron, so it has not run); warm changed to Once runs and fails (its
    Dataset has no runtime): m is Failed with warm's reason, and runs no copy."""
    (tmp_path / "raw").mkdir()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "x").write_bytes(b"x")
    ds = doc("Dataset", "raw", {"mounts": [{"name": "raw", "mountPoint": str(tmp_path / "raw")}]})
    warm = {"dataset": {"name": "raw"}, "policy": "Cron", "schedule": "0 3 * * *"}
    m = doc("DataMigrate", "m", {"from": {"externalStorage": {"uri": str(tmp_path / "src")}},
                                 "to": {"dataset": {"name": "raw"}}, "runAfter": {"kind": "DataLoad", "name": "warm"}})
    apply_text(datacache_home, tmp_path, "\n---\n".join([ds, doc("DataLoad", "warm", warm), m]))
    plane = Embedded(str(datacache_home))
    assert plane.state.get("DataMigrate", "m")["status"]["conditions"][0]["reason"] == "WaitingForPredecessor"
    plane.close()
    with pytest.raises(ResourceError) as err:
        apply_text(datacache_home, tmp_path, doc("DataLoad", "warm", {"dataset": {"name": "raw"}}), "again.yaml")
    reason = ("dataset default/raw has no CacheRuntime: apply a CacheRuntime (or ThinRuntime) named 'raw' in namespace "
              "'default' to cache it")
    assert str(err.value) == f"dataload.datacache.io/warm: stored, but failed: {reason}"
    plane = Embedded(str(datacache_home))
    try:
        status = plane.state.get("DataMigrate", "m")["status"]
        assert status["phase"] == "Failed" and status["conditions"][0]["reason"] == "PredecessorFailed"
        assert status["conditions"][0]["message"] == f"runAfter: dataload default/warm failed: {reason}"
    finally:
        plane.close()
    assert os.listdir(tmp_path / "raw") == []


def test_a_step_running_in_another_process_is_not_started_twice(datacache_home, tmp_path):
    (tmp_path / "raw").mkdir()
    (tmp_path / "src").mkdir()
    text = "\n---\n".join([doc("Dataset", "raw", {"mounts": [{"name": "raw", "mountPoint": str(tmp_path / "raw")}]}),
                           doc("DataMigrate", "m", {"from": {"externalStorage": {"uri": str(tmp_path / "src")}},
                                                    "to": {"dataset": {"name": "raw"}}})])
    apply_text(datacache_home, tmp_path, text)
    other = subprocess.Popen(["sleep", "30"])
    try:
        plane = Embedded(str(datacache_home))
        plane.state.set_status("DataMigrate", "m", "default", {"phase": "Executing", "runnerPid": other.pid})
        plane.close()
        (tmp_path / "src" / "new").write_bytes(b"new")
        with pytest.raises(ResourceError) as err:
            apply_text(datacache_home, tmp_path, text)
        assert str(err.value) == (f"datamigrate.datacache.io/m: stored, but failed: it is running now (process "
                                  f"{other.pid}): apply it again once it has finished")
        assert os.listdir(tmp_path / "raw") == []
    finally:
        other.kill()
        other.wait()
    apply_text(datacache_home, tmp_path, text)  # that process is gone: the run left Executing is run again
    assert os.listdir(tmp_path / "raw") == ["new"]
