"""Record and replay (issue 21 item 4): a run's access trace through ``datacache://`` and a FUSE
mount, then ``warmup --from-trace`` and a DataLoad ``{trace: RUN}`` warming exactly that set."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import fsspec
import pytest

from datacache.api.quantity import format_bytes
from datacache.plan.trace import read_trace
from plan_support import make_dataset

N = 30


def dc(*args, home):
    return subprocess.run([sys.executable, "-m", "datacache", *args], capture_output=True, timeout=120,
                          env={**os.environ, "DATACACHE_HOME": str(home)})


@pytest.fixture
def pics(datacache_home, tmp_path):
    """``(plane, {path: bytes})``: dataset ``pics`` of N files of 3-4 KB."""
    plane, files = make_dataset(datacache_home, tmp_path, "pics", [3000 + 37 * i for i in range(N)])
    yield plane, files
    plane.close()


def _record(plane, files, run: str, order: list[str]) -> None:
    fs = fsspec.filesystem("datacache", home=plane.home, record=run, skip_instance_cache=True)
    try:
        for path in order:
            with fs.open(f"pics/{path}") as f:
                assert f.read() == files[path]
            assert fs.cat_file(f"pics/{path}") == files[path]  # a second read: not traced again
    finally:
        fs.close()


def test_a_recorded_run_is_warmed_exactly_in_its_order(pics):
    plane, files = pics
    order = [f"train/{i:03d}.jpg" for i in (17, 3, 25, 8, 11, 0, 29)]
    _record(plane, files, "epoch1", order)
    ddir = os.path.join(plane.home, "datasets", "default", "pics")
    assert read_trace(ddir, "pics") == ("epoch1", [(p, len(files[p])) for p in order])
    assert os.stat(os.path.join(ddir, "traces", "epoch1.trace")).st_mode & 0o777 == 0o600
    shutil.rmtree(os.path.join(plane.home, "cache"))  # what the run's reads cached: the warmup loads it again
    ran = dc("warmup", "pics", "--from-trace", "-q", home=plane.home)
    assert ran.returncode == 0, ran.stderr.decode()
    out = ran.stdout.decode()
    traced_bytes = sum(len(files[p]) for p in order)
    size = format_bytes(traced_bytes)
    assert "Complete in " in out and f"{size} loaded from the UFS" in out, out  # no byte more than the trace
    assert f"trace:epoch1: Complete: 7 files, {size} of {size} cached" in out, out
    client = plane.open_dataset("pics")
    try:
        cached = {p for p in files if client.cached_fraction(client.stat(p)) == 1.0}
        assert cached == set(order)  # exactly the traced set
        assert client.cached_bytes() == traced_bytes
    finally:
        client.close()
    table = dc("get", "datasets", "-o", "wide", home=plane.home).stdout.decode().splitlines()
    assert table[0].split()[-3:] == ["LAST", "TRACE", "CACHED"] and table[1].split()[-1] == "100.0%"


def test_a_dataload_trace_target_and_bad_traces(pics, tmp_path):
    plane, files = pics
    order = [f"train/{i:03d}.jpg" for i in (4, 2)]
    _record(plane, files, "run-a", order)
    dl = {"apiVersion": "datacache.io/v1alpha1", "kind": "DataLoad", "metadata": {"name": "replay"},
          "spec": {"dataset": {"name": "pics"}, "target": [{"trace": "run-a"}]}}
    (tmp_path / "dl.yaml").write_text(json.dumps(dl))
    ran = dc("apply", "-f", str(tmp_path / "dl.yaml"), home=plane.home)
    assert ran.returncode == 0, ran.stderr.decode()
    status = json.loads(dc("get", "dataloads", "replay", "-o", "json", home=plane.home).stdout)["status"]
    assert status["phase"] == "Complete"
    (target,) = status["targets"]
    assert (target["path"], target["files"], target["bytes"]) == ("trace:run-a", 2, sum(len(files[p]) for p in order))
    ran = dc("warmup", "pics", "--from-trace", "nope", home=plane.home)
    assert ran.returncode == 1
    assert ran.stderr.decode().strip() == "error: dataset 'pics' has no trace 'nope' (recorded: run-a)"
    dl["spec"]["target"] = [{"trace": "run-a", "path": "/train"}]
    (tmp_path / "dl.yaml").write_text(json.dumps(dl))
    ran = dc("apply", "-f", str(tmp_path / "dl.yaml"), home=plane.home)
    assert ran.returncode == 1 and "give either path (a dataset path) or trace (a recorded run)" in ran.stderr.decode()
