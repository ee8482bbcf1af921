"""Embedded supervision through the CLI: workers outlive the command that started them, scale
3 -> 4 -> 2 keeps every read correct and hands exactly the blocks HRW says (about 1/N) to the new
worker, and the removed workers' blocks to their new owners (drain), delete
stops every process; a worker killed in the middle of a warmup; a killed supervisor heals."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

from cluster_support import (MiB, apply_cluster, block_bytes, kill_worker, live, processes_of, stored_keys,
                             wait_for, write_files)
from datacache.cluster.auth import runtime_dir
from datacache.cluster.placement import owners
from datacache.control.embedded import Embedded
from datacache.control.supervisor import read_pid
from datacache.warmup import warmup

BLOCK = 256 << 10


def dc(*args, home):
    proc = subprocess.run([sys.executable, "-m", "datacache", *args], capture_output=True, timeout=120,
                          env={**os.environ, "DATACACHE_HOME": str(home)})
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout.decode()


def _cached_keys(plane, name):
    client = plane.open_dataset(name)
    try:
        keys = block_bytes(client.manifest, BLOCK, name)
        by_file = {}
        for e in client.manifest:
            for i in range(-(-e.size // BLOCK)):
                by_file[str(client.source.key(e, i))] = client.source.is_cached(e, i)
        assert set(by_file) == set(keys)
        return {k for k, held in by_file.items() if held}, set(keys)
    finally:
        client.close()


def _read_all(plane, name, contents):
    client = plane.open_dataset(name)
    try:
        for path, data in contents.items():
            with client.open(path) as f:
                assert f.read() == data, path
    finally:
        client.close()


def test_scale_3_4_2_through_the_cli(cluster_home, tmp_path):
    src = tmp_path / "src"
    contents = write_files(src, {f"d{i % 5}/f{i:02d}.bin": MiB - 7 * i for i in range(50)})
    doc = [{"apiVersion": "datacache.io/v1alpha1", "kind": "Dataset", "metadata": {"name": "sc"},
            "spec": {"mounts": [{"name": "local", "mountPoint": str(src)}]}},
           {"apiVersion": "datacache.io/v1alpha1", "kind": "CacheRuntime", "metadata": {"name": "sc"},
            "spec": {"replicas": 3, "blockSize": "256Ki",
                     "tieredstore": {"levels": [{"mediumtype": "SSD", "path": "cache", "quota": "1Gi"}]}}}]
    (tmp_path / "sc.yaml").write_text("\n---\n".join(json.dumps(d) for d in doc))
    dc("apply", "-f", str(tmp_path / "sc.yaml"), home=cluster_home)
    # The CLI has exited; its workers still serve.
    workers = live(cluster_home, "sc")
    assert sorted(workers) == ["worker-0", "worker-1", "worker-2"]
    assert all(read_pid(os.path.join(runtime_dir(str(cluster_home), "default", "sc"), f"{w}.pid")) == m.pid
               for w, m in workers.items())
    assert "Complete" in dc("warmup", "sc", "-q", home=cluster_home)
    plane = Embedded(str(cluster_home))
    cached, every = _cached_keys(plane, "sc")
    assert cached == every and len(every) > 150

    out = dc("scale", "cacheruntime", "sc", "--replicas", "4", home=cluster_home)
    assert out.strip() == "cacheruntime.datacache.io/sc scaled"
    assert sorted(live(cluster_home, "sc")) == [f"worker-{i}" for i in range(4)]
    four = [f"worker-{i}" for i in range(4)]
    cached, _ = _cached_keys(plane, "sc")
    assert cached == every  # blocks not yet moved count where they are (the new owner finds them there)
    moved = {k for k in every if owners(k, four)[0] == "worker-3"}

    def handed_off():  # worker-3 holds exactly its share, and nobody else keeps a copy of it
        stored = stored_keys(cluster_home, "sc")
        return stored["worker-3"] == moved and not any(moved & held for w, held in stored.items() if w != "worker-3")

    wait_for(handed_off, 45, "worker-3's share to move")
    assert abs(len(moved) / len(every) - 1 / 4) < 0.1  # exactly the new worker's share moved, about 1/N
    _read_all(plane, "sc", contents)

    out = dc("scale", "runtime", "sc", "--replicas", "2", home=cluster_home)
    assert sorted(live(cluster_home, "sc")) == ["worker-0", "worker-1"]
    cached, _ = _cached_keys(plane, "sc")
    two = ["worker-0", "worker-1"]
    gone = {k for k in every if owners(k, four)[0] not in two}
    assert abs(len(gone) / len(every) - 1 / 2) < 0.1  # the two removed workers' share...
    moved = re.findall(r"drained (worker-[23]): (\d+)/(\d+) blocks handed to their new owners", out)
    assert [w for w, _, _ in moved] == ["worker-2", "worker-3"], out
    assert all(a == b for _, a, b in moved) and sum(int(a) for _, a, _ in moved) == len(gone)  # ...handed off
    stored = stored_keys(cluster_home, "sc")
    assert cached == every == every & (stored["worker-0"] | stored["worker-1"])
    assert not every & (stored["worker-2"] | stored["worker-3"])
    _read_all(plane, "sc", contents)
    status = json.loads(dc("get", "runtimes", "sc", "-o", "json", home=cluster_home))["status"]
    assert (status["desiredWorkers"], status["readyWorkers"], status["phase"]) == (2, 2, "Ready")
    assert [w["name"] for w in status["workers"]] == ["sc-worker-0", "sc-worker-1"]
    assert "worker-0=" in dc("get", "runtimes", "-o", "wide", home=cluster_home)
    plane.close()

    dc("delete", "cacheruntime", "sc", home=cluster_home)
    assert processes_of(cluster_home) == []
    assert live(cluster_home, "sc") == {}


def _failed_paths(result) -> tuple[set[str], int]:
    """Files named in the failures, and how many failed in all (the list stops at 10)."""
    named, more = set(), 0
    for target in result.targets:
        for failure in target.failures:
            extra = re.match(r"\.\.\. and (\d+) more", failure)
            if extra:
                more += int(extra[1])
            else:
                named.add(failure.split(": ", 1)[0])
    return named, len(named) + more


def test_kill_9_a_worker_in_the_middle_of_a_warmup(cluster_home, tmp_path):
    src = tmp_path / "src"
    contents = write_files(src, {f"f{i:02d}.bin": MiB for i in range(40)})
    plane = apply_cluster(cluster_home, "wk", [{"name": "local", "mountPoint": str(src)}])
    supervisor_pid = read_pid(os.path.join(runtime_dir(str(cluster_home), "default", "wk"), "supervisor.pid"))
    client = plane.open_dataset("wk")
    killed = []

    def on_progress(p):  # runs inside the warmup: the kill lands while segments are in flight
        if not killed and p.bytes_done >= p.bytes_total // 4:
            os.kill(supervisor_pid, signal.SIGSTOP)  # keep it dead while we look
            killed.append(kill_worker(cluster_home, "wk", "worker-1"))

    result = warmup(client, parallel=4, segment_bytes=BLOCK, on_progress=on_progress)
    assert killed
    fresh = plane.open_dataset("wk")
    missing = {e.path for e in fresh.manifest if fresh.cached_fraction(e) < 1.0}
    named, count = _failed_paths(result)
    if result.ok:
        assert not missing
    else:  # exactly what is missing is reported, nothing else
        assert named <= missing and count == len(missing)
    expected = block_bytes(fresh.manifest, BLOCK, "wk")
    stored = stored_keys(cluster_home, "wk")
    for e in fresh.manifest:
        if e.path not in missing:  # what counts as cached really is on a live worker's disk
            fid = str(fresh.source.key(e, 0)).rsplit("/", 1)[0]
            keys = [k for k in expected if k.startswith(fid + "/")]
            assert all(any(k in stored[w] for w in ("worker-0", "worker-2")) for k in keys), e.path
    fresh.close()
    client.close()

    os.kill(supervisor_pid, signal.SIGCONT)  # worker-1 comes back with its disk; a re-run completes
    wait_for(lambda: len(live(cluster_home, "wk")) == 3, 30, "worker-1 to restart")
    client = plane.open_dataset("wk")
    assert warmup(client).ok
    for path, data in contents.items():
        with client.open(path) as f:
            assert f.read() == data
    client.close()
    plane.close()


def test_a_killed_supervisor_takes_its_workers_and_heals_on_next_use(cluster_home, tmp_path):
    src = tmp_path / "src"
    contents = write_files(src, {"a.bin": 3 * BLOCK + 1})
    plane = apply_cluster(cluster_home, "sv", [{"name": "local", "mountPoint": str(src)}], replicas=2)
    pids = [m.pid for m in live(cluster_home, "sv").values()]
    rdir = runtime_dir(str(cluster_home), "default", "sv")
    os.kill(read_pid(os.path.join(rdir, "supervisor.pid")), signal.SIGKILL)
    wait_for(lambda: not set(pids) & set(processes_of(cluster_home)), 15, "orphaned workers to exit")
    client = plane.open_dataset("sv")  # restarts the supervisor and waits for its workers
    assert len(live(cluster_home, "sv")) == 2
    with client.open("a.bin") as f:
        assert f.read() == contents["a.bin"]
    client.close()
    plane.close()
