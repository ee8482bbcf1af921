"""Scale-in drains before it stops (issue 4): 3 -> 2 workers over a moto S3 bucket hands the
leaving worker's blocks to their new HRW owners, so cachedPercentage stays 100% (from the blocks
stored), the two workers hold exactly their HRW shares, every file reads back sha256-equal with no
UFS read, and a reader running through the scale-in never fails."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import threading
import time

from cluster_support import apply_cluster, block_bytes, live, stored_keys, wait_for
from datacache.cache.blocks import file_id
from datacache.cluster.placement import owners
from datacache.control import supervisor
from datacache.control.reconcile import percentage
from datacache.control.supervisor import DRAIN_ENV

NAME = "dr"
BS = 64 << 10


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _s3_dataset(home, s3_bucket) -> dict[str, bytes]:
    """30 objects (1 to 4 blocks, odd sizes) in the bucket; the moto secret as files (the workers
    are daemons and read secrets from ``$DATACACHE_HOME/secrets``)."""
    fs, bucket = s3_bucket
    files = {}
    for i in range(30):
        files[f"s3/d{i % 3}/f{i:02d}.bin"] = data = os.urandom(BS * (1 + i % 4) - 13 * i)
        fs.pipe(f"{bucket}/d{i % 3}/f{i:02d}.bin", data)
    for key in ("key", "secret"):
        os.makedirs(home / "secrets" / "moto", exist_ok=True)
        (home / "secrets" / "moto" / key).write_text("testing")
    return files


def _mounts(s3_bucket, moto_server) -> list[dict]:
    return [{"name": "s3", "mountPoint": f"s3://{s3_bucket[1]}", "path": "/s3",
             "options": {"endpoint_url": moto_server.endpoint_url},
             "encryptOptions": [{"name": k, "valueFrom": {"secretKeyRef": {"name": "moto", "key": k}}}
                                for k in ("key", "secret")]}]


def _cached_percentage(plane) -> str:
    return plane.refresh_status("Dataset", NAME)["cacheStates"]["cachedPercentage"]


def test_scale_in_3_to_2_hands_the_leaving_workers_blocks_to_their_new_owners(cluster_home, s3_bucket, moto_server):
    files = _s3_dataset(cluster_home, s3_bucket)
    plane = apply_cluster(cluster_home, NAME, _mounts(s3_bucket, moto_server), replicas=3, block_size="64Ki")
    try:
        assert plane.warmup(NAME, [])[1].ok
        every = set(block_bytes(plane.load_manifest(plane.get("Dataset", NAME)), BS, NAME))
        before = stored_keys(cluster_home, NAME)
        leaving = every & before["worker-2"]
        assert set().union(*before.values()) >= every and leaving
        assert _cached_percentage(plane) == "100.0%"

        reader = plane.open_dataset(NAME)
        stop, errors, reads = threading.Event(), [], [0]

        def read_all():  # through the scale-in: every read must succeed with the right bytes
            try:
                while not stop.is_set():
                    for rel, data in files.items():
                        with reader.open(rel) as f:
                            if sha(f.read()) != sha(data):
                                errors.append(f"{rel}: wrong bytes")
                        reads[0] += 1
            except Exception as err:  # any failed read fails the test
                errors.append(repr(err))

        thread = threading.Thread(target=read_all)
        thread.start()
        try:
            started = time.monotonic()
            proc = subprocess.run([sys.executable, "-m", "datacache", "scale", "cacheruntime", NAME, "--replicas", "2"],
                                  capture_output=True, timeout=120, env={**os.environ, "DATACACHE_HOME": str(cluster_home)})
            took = time.monotonic() - started
            during = reads[0]
        finally:
            stop.set()
            thread.join(60)
            reader.close()
        assert proc.returncode == 0, proc.stderr.decode()
        assert not errors, errors[:5]
        assert during > 0
        out = proc.stdout.decode().strip()
        drained = re.fullmatch(r"cacheruntime\.datacache\.io/dr scaled \(drained worker-2: (\d+)/(\d+) blocks handed "
                               r"to their new owners in ([\d.]+)s\)", out)
        assert drained, out
        assert int(drained[1]) == int(drained[2]) == len(leaving)

        two = ["worker-0", "worker-1"]
        assert sorted(live(cluster_home, NAME)) == two
        assert _cached_percentage(plane) == "100.0%"
        after = stored_keys(cluster_home, NAME)
        for w in two:  # each survivor holds (at least) exactly its HRW share
            assert after[w] >= {k for k in every if owners(k, two)[0] == w}, w
        assert not after["worker-2"] & every  # the leaving worker's copies were dropped once handed off

        client = plane.open_dataset(NAME)
        try:
            for rel, data in files.items():
                with client.open(rel) as f:
                    assert sha(f.read()) == sha(data), rel
            assert client.source.ufs_bytes == 0  # every block came from the cache
        finally:
            client.close()
        print(f"\ndrain 3->2: {len(leaving)} of {len(every)} blocks moved, drain {drained[3]}s, scale command "
              f"{took:.1f}s, {during} reads during it; cachedPercentage 100.0% -> {_cached_percentage(plane)}")
    finally:
        plane.close()


def test_a_drain_is_bounded_and_reports_what_it_could_not_move(cluster_home, s3_bucket, moto_server, monkeypatch):
    monkeypatch.setenv(DRAIN_ENV, "1")  # the supervisor started by apply inherits it
    files = _s3_dataset(cluster_home, s3_bucket)
    plane = apply_cluster(cluster_home, NAME, _mounts(s3_bucket, moto_server), replicas=3, block_size="64Ki")
    try:
        assert plane.warmup(NAME, [])[1].ok
        before = stored_keys(cluster_home, NAME)
        # A file with blocks on worker-2 changes in the bucket: those blocks are of an old version now.
        old = {e.path: e for e in plane.load_manifest(plane.get("Dataset", NAME))}
        changed = next(p for p, e in old.items()
                       if f"{NAME}/{file_id(e.mount, e.ufs_path, e.version, BS)}/0" in before["worker-2"])
        files[changed.lstrip("/")] = data = os.urandom(BS + 5)
        s3_bucket[0].pipe(f"{s3_bucket[1]}/{old[changed].ufs_path.split('/', 1)[1]}", data)
        plane.sync(NAME)
        manifest = plane.load_manifest(plane.get("Dataset", NAME))
        assert manifest.lookup(changed).version != old[changed].version
        every = block_bytes(manifest, BS, NAME)
        leaving = set(every) & before["worker-2"]
        stale = {k for k in before["worker-2"] if k not in every}
        two = ["worker-0", "worker-1"]
        to_stopped = {k for k in leaving if owners(k, two)[0] == "worker-1"}
        assert stale and to_stopped

        stopped = live(cluster_home, NAME)["worker-1"].pid
        leaver = live(cluster_home, NAME)["worker-2"].pid
        os.kill(stopped, signal.SIGSTOP)  # an owner that accepts connections and never answers
        try:
            started = time.monotonic()
            proc = subprocess.Popen([sys.executable, "-m", "datacache", "scale", "cacheruntime", NAME, "--replicas", "2"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            wait_for(lambda: supervisor._start_time(leaver) is None, 60, "worker-2 to stop")
            stopped_after = time.monotonic() - started
        finally:
            os.kill(stopped, signal.SIGCONT)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
        report = re.fullmatch(r"cacheruntime\.datacache\.io/dr scaled \(drained worker-2: (\d+)/(\d+) blocks handed to "
                              r"their new owners in ([\d.]+)s; (\d+) left in its cache directory \((.*)\); (\d+) blocks "
                              r"of old file versions not moved\)", out.decode().strip())
        assert report, out.decode()
        moved, blocks, seconds, left, why, old_blocks = report.groups()
        assert int(blocks) == len(leaving) == int(moved) + int(left) and int(left) >= len(to_stopped)
        assert int(old_blocks) == len(stale)
        assert "worker-1: " in why and "cache worker worker-1 timed out after 5s" in why, why
        assert float(seconds) < 8 and stopped_after < 20  # 1 s bound, plus the pass in flight (5 s timeout)
        print(f"\n{out.decode().strip()} (worker-2 stopped {stopped_after:.1f}s after the command started)")

        after = stored_keys(cluster_home, NAME)
        assert len(after["worker-2"] & set(every)) == int(left)  # what was not moved stays in its directory
        assert after["worker-2"] >= stale
        held = sum(every[k] for k in every if k in after["worker-0"] | after["worker-1"])
        assert _cached_percentage(plane) == percentage(held, sum(every.values()))
        client = plane.open_dataset(NAME)
        try:
            for rel, data in files.items():
                with client.open(rel) as f:
                    assert sha(f.read()) == sha(data), rel
        finally:
            client.close()
    finally:
        plane.close()


def test_a_wrong_drain_timeout_is_one_clear_line(cluster_home, tmp_path):
    os.makedirs(tmp_path / "src")
    apply_cluster(cluster_home, NAME, [{"name": "local", "mountPoint": str(tmp_path / "src")}], replicas=1).close()
    proc = subprocess.run([sys.executable, "-m", "datacache", "scale", "cacheruntime", NAME, "--replicas", "2"],
                          capture_output=True, timeout=60,
                          env={**os.environ, "DATACACHE_HOME": str(cluster_home), DRAIN_ENV: "ten"})
    assert proc.returncode != 0
    assert proc.stderr.decode().strip().splitlines()[-1].endswith(
        "DATACACHE_DRAIN_TIMEOUT_S: 'ten' is not a whole number of seconds from 1 to 86400 "
        "(unset it for the default, 60)"), proc.stderr.decode()
