"""DataLoad policies: Cron fired by the controller on a short schedule, OnEvent fired by a sync
that sees a changed S3 object (moto), cancellation and resume, bounded warmup history."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time

import pytest

from datacache.api.loader import load_resource_dict
from datacache.api.quantity import format_bytes
from datacache.control import dataloads
from datacache.control.controller import Controller
from support import apply_dataset, s3_mount

KiB = 1024


def dataload(name: str, dataset: str, **spec) -> object:
    return load_resource_dict({"apiVersion": "datacache.io/v1alpha1", "kind": "DataLoad", "metadata": {"name": name},
                               "spec": {"dataset": {"name": dataset}, **spec}}, "test")


def fraction(plane, dataset: str, path: str) -> float:
    client = plane.open_dataset(dataset)
    try:
        return client.cached_fraction(client.stat(path))
    finally:
        client.close()


def local_source(tmp_path, sizes: dict[str, int]) -> tuple[str, dict[str, bytes]]:
    root = tmp_path / "src"
    data = {}
    for rel, size in sizes.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        data[rel] = os.urandom(size)
        (root / rel).write_bytes(data[rel])
    return str(root), data


def test_cron_dataload_fires_on_a_short_schedule(datacache_home, tmp_path):
    root, _ = local_source(tmp_path, {"a/x.bin": 200 * KiB, "b/y.bin": 100 * KiB})
    plane = apply_dataset(datacache_home, "cron", [{"name": "local", "mountPoint": root}], block_size="64Ki")
    plane.apply([dataload("nightly", "cron", policy="Cron", schedule="* * * * * */2", target=[{"path": "/a"}])])
    assert plane.state.get("DataLoad", "nightly")["status"] == {"phase": "Pending"}
    assert fraction(plane, "cron", "a/x.bin") == 0.0

    stop = threading.Event()
    ctl = threading.Thread(target=Controller(plane).run, args=(stop, 0.2))
    ctl.start()
    try:
        deadline, status = time.monotonic() + 20, {}
        while time.monotonic() < deadline and "lastSuccessfulTime" not in status:
            time.sleep(0.2)
            status = plane.state.get("DataLoad", "nightly").get("status") or {}
    finally:
        stop.set()
        ctl.join(30)
    assert status["phase"] == "Complete", status
    assert status["lastScheduleTime"] <= status["lastSuccessfulTime"]
    assert status["targets"] == [{"path": "/a", "files": 1, "bytes": 200 * KiB, "cachedBytes": 200 * KiB,
                                  "phase": "Complete", "failures": []}]
    assert fraction(plane, "cron", "a/x.bin") == 1.0 and fraction(plane, "cron", "b/y.bin") == 0.0


def test_cron_due_follows_the_schedule():
    created = "2026-01-01T00:00:00Z"
    t0 = dataloads.parse_iso(created)
    assert not dataloads.cron_due("*/5 * * * *", None, created, t0 + 299)
    assert dataloads.cron_due("*/5 * * * *", None, created, t0 + 300)
    assert not dataloads.cron_due("*/5 * * * *", "2026-01-01T00:05:00Z", created, t0 + 599)


def test_on_event_dataload_fires_when_sync_sees_a_changed_object(datacache_home, s3_bucket, moto_server,
                                                               moto_secrets):
    fs, bucket = s3_bucket
    fs.pipe(f"{bucket}/train/a.bin", os.urandom(300 * KiB))
    fs.pipe(f"{bucket}/other/b.bin", os.urandom(100 * KiB))
    plane = apply_dataset(datacache_home, "ev", [s3_mount(moto_server, bucket)], block_size="64Ki")
    plane.apply([dataload("on-change", "ev", policy="OnEvent", target=[{"path": "/train"}])])

    plane.sync("ev")  # nothing changed: not fired
    assert plane.state.get("DataLoad", "on-change")["status"] == {"phase": "Pending"}

    new = os.urandom(310 * KiB)
    fs.pipe(f"{bucket}/train/a.bin", new)
    fs.pipe(f"{bucket}/other/b.bin", os.urandom(90 * KiB))
    fs.invalidate_cache()
    diff = plane.sync("ev")
    assert (diff.changed, diff.added) == (["other/b.bin", "train/a.bin"], [])
    status = plane.state.get("DataLoad", "on-change")["status"]
    assert status["phase"] == "Complete", status
    assert status["targets"][0]["cachedBytes"] == len(new)
    assert fraction(plane, "ev", "train/a.bin") == 1.0 and fraction(plane, "ev", "other/b.bin") == 0.0
    client = plane.open_dataset("ev")
    try:
        with client.open("train/a.bin") as f:
            assert hashlib.sha256(f.read()).hexdigest() == hashlib.sha256(new).hexdigest()
    finally:
        client.close()

    before = json.dumps(status)
    fs.pipe(f"{bucket}/other/b.bin", os.urandom(80 * KiB))  # a change outside its target
    fs.invalidate_cache()
    plane.sync("ev")
    assert json.dumps(plane.state.get("DataLoad", "on-change")["status"]) == before


def test_on_event_fires_for_a_change_a_reader_met_before_the_sync(datacache_home, tmp_path):
    """A reader that meets a changed file refreshes its entry (ESTALE, case C5) and stores the
    manifest: the next sync diffs nothing, yet the OnEvent DataLoad on that file must run."""
    from datacache.errors import StaleFileError

    root, data = local_source(tmp_path, {"t/b.bin": 200 * KiB, "u/c.bin": 50 * KiB})
    plane = apply_dataset(datacache_home, "rf", [{"name": "local", "mountPoint": root}], block_size="64Ki")
    plane.apply([dataload("on-t", "rf", policy="OnEvent", target=[{"path": "/t"}])])
    new = os.urandom(210 * KiB)
    with open(os.path.join(root, "t/b.bin"), "wb") as f:
        f.write(new)
    client = plane.open_dataset("rf")
    try:
        with pytest.raises(StaleFileError):
            client.open("t/b.bin").read()  # the old version cannot be read: the entry is refreshed
        assert client.stat("t/b.bin").size == len(new)
    finally:
        client.close()
    diff = plane.sync("rf")
    assert (diff.added, diff.changed, diff.deleted) == ([], [], [])  # the refresh stored it already
    assert diff.refreshed == ("t/b.bin",)  # ... and the sync says so
    status = plane.state.get("DataLoad", "on-t")["status"]
    assert status["phase"] == "Complete", status
    assert status["targets"][0]["cachedBytes"] == len(new)
    assert fraction(plane, "rf", "t/b.bin") == 1.0 and fraction(plane, "rf", "u/c.bin") == 0.0
    assert plane.sync("rf").refreshed == ()  # the record was taken: no second run
    assert plane.state.get("DataLoad", "on-t")["status"]["lastScheduleTime"] == status["lastScheduleTime"]


def test_a_once_dataload_whose_run_fails_is_stored_and_apply_says_why(datacache_home, tmp_path):
    from datacache.control.embedded import ApplyError

    root, _ = local_source(tmp_path, {"t/a.bin": 10 * KiB})
    plane = apply_dataset(datacache_home, "once", [{"name": "local", "mountPoint": root}])
    with pytest.raises(ApplyError) as info:
        plane.apply([dataload("load-nope", "once", target=[{"path": "/nope"}, {"path": "/t"}])])
    assert info.value.lines == ["dataload.datacache.io/load-nope created"]
    assert info.value.failures == [
        "dataload.datacache.io/load-nope: stored, but failed: its run failed: /nope: no such file, directory or "
        "match in dataset 'once' as of its last metadata sync; a file added to the UFS since is listed after "
        "`datacache sync once` (or the Dataset's spec.autoSyncInterval)"]
    status = plane.state.get("DataLoad", "load-nope")["status"]
    assert status["phase"] == "Failed" and [t["phase"] for t in status["targets"]] == ["Failed", "Complete"]
    assert fraction(plane, "once", "t/a.bin") == 1.0  # the target that exists was loaded


def test_cancelled_warmup_is_cancelled_and_resumes(datacache_home, tmp_path):
    sizes = {f"f{i:03d}.bin": 128 * KiB for i in range(160)}
    root, data = local_source(tmp_path, sizes)
    plane = apply_dataset(datacache_home, "big", [{"name": "local", "mountPoint": root}], block_size="64Ki")
    cancel = threading.Event()
    name, first = plane.warmup("big", [], on_progress=lambda p: p.files_done >= 3 and cancel.set(), cancel=cancel)
    assert not first.ok and first.phase == "Cancelled" and first.in_flight == ()
    status = plane.state.get("DataLoad", name)["status"]
    assert status["phase"] == "Cancelled" and status["conditions"][0]["reason"] == "Cancelled"
    # Files the cancel left out are not failures: none is named, the target is Cancelled.
    assert status["targets"][0]["failures"] == [] and status["targets"][0]["phase"] == "Cancelled"
    cached = status["targets"][0]["cachedBytes"]
    assert f"{format_bytes(cached)} of {format_bytes(sum(sizes.values()))} cached" in status["conditions"][0]["message"]
    assert 0 < cached < sum(sizes.values())

    _, second = plane.warmup("big", [])  # resumes: cached blocks are not read again
    assert second.ok and second.loaded_bytes == sum(sizes.values()) - cached
    client = plane.open_dataset("big")
    try:
        for rel, content in data.items():
            assert client.cached_fraction(client.stat(rel)) == 1.0
            with client.open(rel) as f:
                assert f.read() == content
    finally:
        client.close()


def test_warmup_history_is_bounded(datacache_home, tmp_path):
    root, _ = local_source(tmp_path, {"x.bin": 1000})
    plane = apply_dataset(datacache_home, "hist", [{"name": "local", "mountPoint": root}])
    plane.apply([dataload("keep-me", "hist", policy="OnEvent")])
    names = [plane.warmup("hist", [])[0] for _ in range(dataloads.WARMUP_HISTORY + 3)]
    kept = sorted(d["metadata"]["name"] for d in plane.state.list("DataLoad"))
    assert kept == sorted(names[-dataloads.WARMUP_HISTORY:] + ["keep-me"])
