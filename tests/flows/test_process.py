"""DataProcess on its own, embedded: the dataset mounted read-only for the command, a timeout that
stops the command and everything it started, a command that cannot start, a dataset without a
runtime; every case leaves no mount behind and says why in status."""

from __future__ import annotations

import os
import sys

from datacache.api.loader import load_resources
from datacache.control.embedded import ApplyError, Embedded
from flow_support import doc, local_dataset, write_yaml


def mounted(path) -> bool:
    return any(f" {path} " in line for line in open("/proc/self/mountinfo"))


def run(home, tmp_path, spec: dict, runtime: bool = True) -> tuple[dict, str]:
    """Apply Dataset "raw" (a directory with one file) and DataProcess "p"; ``(status, apply error)``."""
    (tmp_path / "raw").mkdir(exist_ok=True)
    (tmp_path / "raw" / "in.txt").write_text("hello\n")
    docs = local_dataset("raw", tmp_path / "raw")[:2 if runtime else 1]
    path = write_yaml(tmp_path / "p.yaml", [*docs, doc("DataProcess", "p", {
        "dataset": {"name": "raw"}, "mountPath": str(tmp_path / "mnt"), **spec})])
    plane = Embedded(str(home))
    error = ""
    try:
        plane.apply(load_resources(path))
    except ApplyError as err:
        error = str(err)
    try:
        return plane.state.get("DataProcess", "p")["status"], error
    finally:
        plane.close()


def test_reads_the_dataset_read_only(datacache_home, tmp_path, monkeypatch):
    monkeypatch.setenv("DATACACHE_SECRET_S3_KEY", "s3cr3t-value")  # the plane's secret: not the command's
    script = ("import os; p = os.environ['DATACACHE_DATASET_PATH']; print(open(p + '/in.txt').read().strip());"
              "print(sorted(k for k in os.environ if 'SECRET' in k)); open(p + '/new.txt', 'w')")
    status, error = run(datacache_home, tmp_path, {"command": [sys.executable, "-c", script]})
    assert status["phase"] == "Failed" and status["exitCode"] == 1
    assert status["logTail"][:2] == ["hello", "[]"]  # read through the mount; no secret in its environment
    assert status["logTail"][-1] == f"OSError: [Errno 30] Read-only file system: '{tmp_path}/mnt/new.txt'"
    assert "its run failed: the command failed: exit code 1; its log ends with: OSError: [Errno 30]" in error
    assert not mounted(tmp_path / "mnt") and not os.path.exists(tmp_path / "raw" / "new.txt")


def test_timeout_stops_the_command(datacache_home, tmp_path):
    status, _ = run(datacache_home, tmp_path, {"command": ["sh", "-c", "echo started; sleep 60"],
                                              "timeoutSeconds": 1})
    assert (status["phase"], status["exitCode"], status["logTail"]) == ("Failed", -15, ["started"])
    assert status["conditions"][0]["message"] == ("stopped after timeoutSeconds (1 s): exit code -15; its log ends "
                                                  "with: started")
    assert float(status["duration"].rstrip("s")) < 30
    assert not mounted(tmp_path / "mnt")


def test_command_not_found(datacache_home, tmp_path):
    status, _ = run(datacache_home, tmp_path, {"command": ["no-such-command-xyz"]})
    assert status["phase"] == "Failed"
    assert status["conditions"][0]["reason"] == "StartFailed"
    assert status["conditions"][0]["message"] == "cannot start 'no-such-command-xyz': No such file or directory"
    assert not mounted(tmp_path / "mnt")


def test_dataset_without_runtime(datacache_home, tmp_path):
    status, _ = run(datacache_home, tmp_path, {"command": ["true"]}, runtime=False)
    assert status["conditions"][0]["reason"] == "MountFailed"
    assert status["conditions"][0]["message"].startswith("dataset default/raw has no CacheRuntime: apply a "
                                                         "CacheRuntime (or ThinRuntime) named 'raw'")
    assert not mounted(tmp_path / "mnt")
