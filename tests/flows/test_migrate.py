"""DataMigrate on its own: a Dataset copied out to S3 (objects written whole), newer destination
files kept unless overwrite, per-file failures in status, a Cron migrate fired by the controller."""

from __future__ import annotations

import hashlib
import os
import time

import pytest

from datacache.api.loader import load_resources
from datacache.control import dataloads
from datacache.control.controller import Controller
from datacache.control.embedded import ApplyError, Embedded
from flow_support import doc, local_dataset, s3_storage, write_yaml


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def apply(home, path):
    plane = Embedded(str(home))
    try:
        return plane.apply(load_resources(path))
    finally:
        plane.close()


def status(home, kind: str, name: str) -> dict:
    plane = Embedded(str(home))
    try:
        return plane.state.get(kind, name)["status"]
    finally:
        plane.close()


@pytest.fixture
def local_raw(tmp_path):
    """A directory with three files (relative path → bytes)."""
    files = {"a.bin": os.urandom(70_000), "b/c.bin": os.urandom(10), "b/d.bin": b""}
    for rel, data in files.items():
        (tmp_path / "raw" / os.path.dirname(rel)).mkdir(parents=True, exist_ok=True)
        (tmp_path / "raw" / rel).write_bytes(data)
    return files


def test_dataset_sub_path_to_s3(datacache_home, s3_bucket, moto_server, moto_secrets, local_raw, tmp_path):
    fs, bucket = s3_bucket
    path = write_yaml(tmp_path / "out.yaml", [*local_dataset("raw", tmp_path / "raw"), doc("DataMigrate", "out", {
        "from": {"dataset": {"name": "raw", "path": "/b"}},
        "to": {"externalStorage": s3_storage(moto_server, bucket, "exported")}})])
    assert apply(datacache_home, path)[-1] == "datamigrate.datacache.io/out created"
    fs.invalidate_cache()
    assert {k: sha(fs.cat(k)) for k in fs.find(f"{bucket}/exported")} == {
        f"{bucket}/exported/c.bin": sha(local_raw["b/c.bin"]), f"{bucket}/exported/d.bin": sha(b"")}
    progress = status(datacache_home, "DataMigrate", "out")["progress"]
    assert (progress["filesDone"], progress["bytesTotal"]) == (2, 10)
    # again: both objects are equal (their ETags are the files' MD5s): nothing is copied
    (tmp_path / "out.yaml").write_text((tmp_path / "out.yaml").read_text().replace('"out"', '"out2"'))
    apply(datacache_home, path)
    progress = status(datacache_home, "DataMigrate", "out2")["progress"]
    assert (progress["filesDone"], progress["filesSkipped"]) == (0, 2)


def test_newer_destination_kept_unless_overwrite(datacache_home, local_raw, tmp_path):
    dest = tmp_path / "dest"
    (dest / "b").mkdir(parents=True)
    (dest / "b" / "c.bin").write_bytes(b"edited at the destination")
    later = time.time() + 60
    os.utime(dest / "b" / "c.bin", (later, later))
    spec = {"from": {"externalStorage": {"uri": str(tmp_path / "raw")}}, "to": {"dataset": {"name": "dest"}}}
    path = write_yaml(tmp_path / "m.yaml", [*local_dataset("dest", dest), doc("DataMigrate", "keep", spec)])
    apply(datacache_home, path)
    kept = status(datacache_home, "DataMigrate", "keep")
    assert kept["phase"] == "Complete"
    assert kept["skipped"] == [{"path": "b/c.bin", "reason": "the destination differs and is newer than the source: "
                                                              "kept (set spec.overwrite: true to replace it)"}]
    assert (dest / "b" / "c.bin").read_bytes() == b"edited at the destination"
    assert (dest / "a.bin").read_bytes() == local_raw["a.bin"]

    path = write_yaml(tmp_path / "m2.yaml", [doc("DataMigrate", "replace", {**spec, "overwrite": True})])
    apply(datacache_home, path)
    assert (dest / "b" / "c.bin").read_bytes() == local_raw["b/c.bin"]
    assert status(datacache_home, "DataMigrate", "replace")["skipped"] == []


def test_per_file_failure_in_status(datacache_home, local_raw, tmp_path):
    dest = tmp_path / "dest"
    (dest / "a.bin").mkdir(parents=True)  # a directory where a file should go
    (dest / "a.bin" / "x").write_bytes(b"x")
    path = write_yaml(tmp_path / "m.yaml", [*local_dataset("dest", dest), doc("DataMigrate", "m", {
        "from": {"externalStorage": {"uri": str(tmp_path / "raw")}}, "to": {"dataset": {"name": "dest"}}})])
    with pytest.raises(ApplyError) as err:
        apply(datacache_home, path)
    got = status(datacache_home, "DataMigrate", "m")
    assert got["phase"] == "Failed"
    assert [f["path"] for f in got["failures"]] == ["a.bin"]
    assert got["failures"][0]["message"].startswith("IsADirectoryError: ")
    assert got["conditions"][0]["message"].startswith("1 of 3 files failed (first: a.bin: IsADirectoryError")
    assert "datamigrate.datacache.io/m: stored, but failed: its run failed: 1 of 3 files failed" in str(err.value)
    assert (dest / "b" / "c.bin").read_bytes() == local_raw["b/c.bin"]  # the others were copied
    assert sorted(os.listdir(dest / "a.bin")) == ["x"]  # and no temporary file left anywhere
    assert sorted(os.listdir(dest)) == ["a.bin", "b"]


def test_missing_source_fails_with_reason(datacache_home, tmp_path):
    (tmp_path / "dest").mkdir()
    path = write_yaml(tmp_path / "m.yaml", [*local_dataset("dest", tmp_path / "dest"), doc("DataMigrate", "m", {
        "from": {"externalStorage": {"uri": str(tmp_path / "nowhere")}}, "to": {"dataset": {"name": "dest"}}})])
    with pytest.raises(ApplyError):
        apply(datacache_home, path)
    got = status(datacache_home, "DataMigrate", "m")
    assert (got["phase"], got["conditions"][0]["message"]) == ("Failed", f"the source {tmp_path}/nowhere does not exist")


def test_cron_migrate_fires_on_a_seconds_schedule(datacache_home, local_raw, tmp_path):
    schedule = "* * * * * */2"  # every 2 s: the 6th field is seconds (croniter's order, see DataLoadSpec)
    assert dataloads.next_fire(schedule, 1_000_000.5) == 1_000_002.0
    assert dataloads.next_fire(schedule, 1_000_002.0) == 1_000_004.0
    (tmp_path / "dest").mkdir()
    path = write_yaml(tmp_path / "m.yaml", [*local_dataset("dest", tmp_path / "dest"), doc("DataMigrate", "nightly", {
        "from": {"externalStorage": {"uri": str(tmp_path / "raw")}}, "to": {"dataset": {"name": "dest"}},
        "policy": "Cron", "schedule": schedule})])
    apply(datacache_home, path)
    assert status(datacache_home, "DataMigrate", "nightly") == {"phase": "Pending"}
    assert os.listdir(tmp_path / "dest") == []  # not run at apply
    plane = Embedded(str(datacache_home))
    try:
        created = dataloads.parse_iso(plane.state.get("DataMigrate", "nightly")["metadata"]["creationTimestamp"])
        assert Controller(plane, clock=lambda: created + 0.5).tick() == []  # not due yet
        events = Controller(plane, clock=lambda: created + 2.0).tick()
        assert events == ["datamigrate default/nightly ran on schedule: Complete: 3 files copied, 0 already at the "
                          "destination"]
        assert {rel: sha((tmp_path / "dest" / rel).read_bytes()) for rel in local_raw} == {
            rel: sha(data) for rel, data in local_raw.items()}
        last = dataloads.parse_iso(plane.state.get("DataMigrate", "nightly")["status"]["lastScheduleTime"])
        due = dataloads.next_fire(schedule, last)
        assert Controller(plane, clock=lambda: due - 0.5).tick() == []
        again = Controller(plane, clock=lambda: due).tick()
        assert again == ["datamigrate default/nightly ran on schedule: Complete: 0 files copied, 3 already at the "
                         "destination"]
    finally:
        plane.close()


def test_ttl_seconds_after_finished_deletes_it(datacache_home, local_raw, tmp_path):
    (tmp_path / "dest").mkdir()
    path = write_yaml(tmp_path / "m.yaml", [*local_dataset("dest", tmp_path / "dest"), doc("DataMigrate", "once", {
        "from": {"externalStorage": {"uri": str(tmp_path / "raw")}}, "to": {"dataset": {"name": "dest"}},
        "ttlSecondsAfterFinished": 5})])
    apply(datacache_home, path)
    plane = Embedded(str(datacache_home))
    try:
        done = dataloads.parse_iso(plane.state.get("DataMigrate", "once")["status"]["completionTime"])
        assert Controller(plane, clock=lambda: done + 4).tick() == []
        assert Controller(plane, clock=lambda: done + 5).tick() == [
            "datamigrate.datacache.io/once deleted (ttlSecondsAfterFinished 5 s after it finished)"]
        assert plane.state.get("DataMigrate", "once") is None
        assert sorted(os.listdir(tmp_path / "dest")) == ["a.bin", "b"]  # what it copied stays
    finally:
        plane.close()
