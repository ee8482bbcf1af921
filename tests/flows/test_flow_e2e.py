"""The data flow of issue 22, embedded, with real parts: migrate S3 (moto over HTTP) into a local
directory Dataset, process it (a Python script over a real FUSE mount writing one derived file
per input), warm the processed Dataset; checksums at each step. A failing step stops the chain
with its reason; a migrate SIGKILLed half-way resumes without re-copying finished files and
leaves no partial file at a destination path."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from datacache.control.embedded import Embedded
from datacache.control.migrate import PART_MARK
from flow_support import dc, doc, local_dataset, s3_storage, write_yaml

PROCESS_SCRIPT = """\
import hashlib, os, sys
src, out = os.environ["DATACACHE_DATASET_PATH"], os.environ["OUT"]
if os.environ.get("FAIL"):
    print("refusing: " + os.environ["FAIL"], flush=True)
    sys.exit(3)
for root, _, files in os.walk(src):
    for name in sorted(files):
        rel = os.path.relpath(os.path.join(root, name), src)
        data = open(os.path.join(root, name), "rb").read()
        os.makedirs(os.path.join(out, os.path.dirname(rel)), exist_ok=True)
        with open(os.path.join(out, rel + ".rev"), "wb") as f:
            f.write(data[::-1])
        print(rel, hashlib.sha256(data).hexdigest(), flush=True)
"""


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tree(root) -> dict[str, str]:
    """Relative path → sha256 of every file under ``root``."""
    out = {}
    for base, _, files in os.walk(root):
        for name in files:
            path = os.path.join(base, name)
            out[os.path.relpath(path, root)] = sha(open(path, "rb").read())
    return out


@pytest.fixture
def raw_objects(s3_bucket):
    """Objects under s3://BUCKET/raw/: relative path → bytes."""
    fs, bucket = s3_bucket
    objects = {f"part-{i}.bin": os.urandom(50_000 + 7_919 * i) for i in range(5)}
    objects["nested/deep/last.bin"] = os.urandom(123_457)
    for rel, data in objects.items():
        fs.pipe(f"{bucket}/raw/{rel}", data)
    return bucket, objects


def flow_docs(tmp_path, moto_server, bucket: str, fail: str = "") -> list[dict]:
    script = tmp_path / "derive.py"
    script.write_text(PROCESS_SCRIPT)
    env = [{"name": "OUT", "value": str(tmp_path / "processed")}] + ([{"name": "FAIL", "value": fail}] if fail else [])
    for d in ("raw", "processed"):
        (tmp_path / d).mkdir(exist_ok=True)
    # Written last step first: apply orders a flow by runAfter.
    return [
        doc("DataLoad", "warm", {"dataset": {"name": "processed"}, "loadMetadata": True,
                                 "runAfter": {"kind": "DataProcess", "name": "derive"}}),
        doc("DataProcess", "derive", {"dataset": {"name": "raw"}, "mountPath": str(tmp_path / "mnt"),
                                      "command": [sys.executable, str(script)], "env": env,
                                      "runAfter": {"kind": "DataMigrate", "name": "fetch"}}),
        doc("DataMigrate", "fetch", {"from": {"externalStorage": s3_storage(moto_server, bucket, "raw")},
                                     "to": {"dataset": {"name": "raw"}}, "parallelism": 3}),
        *local_dataset("raw", tmp_path / "raw"), *local_dataset("processed", tmp_path / "processed"),
    ]


def test_migrate_process_warm_flow(datacache_home, moto_server, moto_secrets, raw_objects, tmp_path):
    bucket, objects = raw_objects
    path = write_yaml(tmp_path / "flow.yaml", flow_docs(tmp_path, moto_server, bucket))
    proc = dc("apply", "-f", path, home=datacache_home)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "dataset.datacache.io/raw created", "dataset.datacache.io/processed created",
        "cacheruntime.datacache.io/raw created", "cacheruntime.datacache.io/processed created",
        "datamigrate.datacache.io/fetch created", "dataprocess.datacache.io/derive created",
        "dataload.datacache.io/warm created"]

    # step 1: the local Dataset holds the S3 objects, byte for byte, and was synced
    assert tree(tmp_path / "raw") == {rel: sha(data) for rel, data in objects.items()}
    plane = Embedded(str(datacache_home))
    try:
        migrate = plane.state.get("DataMigrate", "fetch")["status"]
        total = sum(len(d) for d in objects.values())
        assert migrate["phase"] == "Complete" and migrate["failures"] == []
        assert {k: migrate["progress"][k] for k in ("filesDone", "filesSkipped", "filesTotal", "bytesDone",
                                                    "bytesTotal")} == {
            "filesDone": 6, "filesSkipped": 0, "filesTotal": 6, "bytesDone": total, "bytesTotal": total}
        raw = plane.list("Dataset", "default")
        assert {d["metadata"]["name"]: d["status"]["fileNum"] for d in raw} == {"raw": 6, "processed": 6}

        # step 2: one derived file per input, made from the bytes read through the FUSE mount
        assert tree(tmp_path / "processed") == {rel + ".rev": sha(data[::-1]) for rel, data in objects.items()}
        process = plane.state.get("DataProcess", "derive")["status"]
        assert (process["phase"], process["exitCode"]) == ("Complete", 0)
        assert sorted(process["logTail"]) == sorted(f"{rel} {sha(data)}" for rel, data in objects.items())
        assert not [m for m in open("/proc/self/mountinfo").read().splitlines() if str(tmp_path / "mnt") in m]

        # step 3: the processed Dataset is fully cached, and reads back the derived bytes
        assert plane.state.get("DataLoad", "warm")["status"]["phase"] == "Complete"
        processed = {d["metadata"]["name"]: d for d in plane.list("Dataset")}["processed"]
        assert processed["status"]["cacheStates"]["cachedPercentage"] == "100.0%"
        client = plane.open_dataset("processed")
        try:
            for rel, data in objects.items():
                with client.open("/" + rel + ".rev") as f:
                    assert sha(f.read()) == sha(data[::-1])
        finally:
            client.close()
    finally:
        plane.close()

    flows = dc("get", "dataflows", home=datacache_home)
    assert flows.stdout.splitlines()[1].split() == [
        "fetch", "datamigrate/fetch:Complete", "->", "dataprocess/derive:Complete", "->", "dataload/warm:Complete",
        "Complete"]


def test_failing_step_stops_the_chain_with_its_reason(datacache_home, moto_server, moto_secrets, raw_objects,
                                                      tmp_path):
    bucket, _ = raw_objects
    path = write_yaml(tmp_path / "flow.yaml", flow_docs(tmp_path, moto_server, bucket, fail="no labels"))
    proc = dc("apply", "-f", path, home=datacache_home)
    assert proc.returncode == 1
    reason = "the command failed: exit code 3; its log ends with: refusing: no labels"
    assert proc.stderr.splitlines()[:2] == [
        f"error: dataprocess.datacache.io/derive: stored, but failed: its run failed: {reason}",
        f"error: dataload.datacache.io/warm: stored, but failed: runAfter: dataprocess default/derive failed: "
        f"{reason}"]
    assert os.listdir(tmp_path / "processed") == []
    plane = Embedded(str(datacache_home))
    try:
        process = plane.state.get("DataProcess", "derive")["status"]
        assert (process["phase"], process["exitCode"], process["logTail"]) == ("Failed", 3, ["refusing: no labels"])
        warm = plane.state.get("DataLoad", "warm")["status"]
        assert warm["phase"] == "Failed"
        assert warm["conditions"][0]["reason"] == "PredecessorFailed"
        assert warm["conditions"][0]["message"] == f"runAfter: dataprocess default/derive failed: {reason}"
    finally:
        plane.close()
    flows = dc("get", "dataflows", home=datacache_home).stdout.splitlines()
    assert flows[1].split()[:8] == ["fetch", "datamigrate/fetch:Complete", "->", "dataprocess/derive:Failed", "->",
                                    "dataload/warm:Failed", "Failed", "dataprocess/derive"]
    assert flows[1].endswith(reason)
    tables = dc("get", "datamigrates,dataprocesses,dataloads", home=datacache_home).stdout.split("\n\n")
    assert [t.splitlines()[1].split()[:3] for t in tables] == [["fetch", "Once", "Complete"],
                                                                 ["derive", "raw", "Failed"], ["warm", "processed", "Failed"]]
    assert tables[1].splitlines()[1].split()[3] == "3"  # EXIT CODE
    described = yaml.safe_load(dc("describe", "dataload", "warm", home=datacache_home).stdout)
    assert described["flow"] == {"steps": ["datamigrate/fetch: Complete", "dataprocess/derive: Failed",
                                           "dataload/warm: Failed"],
                                 "phase": "Failed", "stoppedAt": "dataprocess/derive", "reason": reason}


def test_killed_migrate_resumes_without_recopying(datacache_home, s3_bucket, moto_server, moto_secrets, tmp_path):
    fs, bucket = s3_bucket
    objects = {f"shard-{i:03d}.bin": os.urandom(1024 * 1024 + i) for i in range(40)}
    for rel, data in objects.items():
        fs.pipe(f"{bucket}/big/{rel}", data)
    dest = tmp_path / "raw"
    dest.mkdir()
    path = write_yaml(tmp_path / "migrate.yaml", [
        *local_dataset("raw", dest),
        doc("DataMigrate", "fetch", {"from": {"externalStorage": s3_storage(moto_server, bucket, "big")},
                                     "to": {"dataset": {"name": "raw"}}, "parallelism": 2})])
    child = subprocess.Popen([sys.executable, "-m", "datacache", "apply", "-f", path],
                             env={**os.environ, "DATACACHE_HOME": str(datacache_home)},
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while len([n for n in os.listdir(dest) if PART_MARK not in n]) < 5:
        assert child.poll() is None and time.monotonic() < deadline, "the migrate ended before it could be killed"
        time.sleep(0.005)
    child.send_signal(signal.SIGKILL)
    child.wait()

    finished = {n: os.stat(dest / n) for n in os.listdir(dest) if PART_MARK not in n}
    assert 5 <= len(finished) < len(objects)
    for name in finished:  # whatever has a destination name is whole
        assert sha((dest / name).read_bytes()) == sha(objects[name])

    proc = dc("apply", "-f", path, home=datacache_home)
    assert proc.returncode == 0, proc.stderr
    assert "datamigrate.datacache.io/fetch unchanged" in proc.stdout.splitlines()
    assert tree(dest) == {rel: sha(data) for rel, data in objects.items()}  # no temporary file left either
    for name, before in finished.items():  # not copied again: same inode, same modification time
        after = os.stat(dest / name)
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    plane = Embedded(str(datacache_home))
    try:
        progress = plane.state.get("DataMigrate", "fetch")["status"]["progress"]
        assert (progress["filesSkipped"], progress["filesDone"]) == (len(finished), len(objects) - len(finished))
    finally:
        plane.close()
