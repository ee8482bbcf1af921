"""Status that another process sees while work runs: phase Updating during a metadata sync (Failed
with the reason after a failed one, the old manifest kept), per-target DataLoad progress mid-run,
and the true reason when the cache does not keep a block (quota, full device)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from datacache.api.quantity import format_bytes
from datacache.stack import syncmark
from datacache.warmup import warmup
from datacache.errors import ResourceError
from support import apply_dataset, s3_mount

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.proxy import DelayProxy  # noqa: E402

KiB = 1024
BS = 64 * KiB

# A second process that runs the real `datacache get KIND -o wide` every 0.1 s and prints each
# table whose text changed, until a table containing STOP follows one containing START, or 120 s.
WATCHER = r"""
import sys, time
from click.testing import CliRunner
from datacache.cli import cli
kind, start, stop = sys.argv[1:4]
runner, last, started, deadline = CliRunner(), None, False, time.monotonic() + 120
print("ready", flush=True)
while time.monotonic() < deadline:
    out = runner.invoke(cli, ["get", kind, "-o", "wide"]).output
    if out != last:
        print(out, "=====", flush=True)
        last = out
    if started and stop in out:
        break
    started = started or start in out
    time.sleep(0.1)
"""


def watch(home, kind: str, start: str, stop: str) -> subprocess.Popen:
    """Start the WATCHER for ``kind``; returns once it has printed its first table (a first
    ``get`` on a loaded machine took longer than the work it was to watch)."""
    proc = subprocess.Popen([sys.executable, "-c", WATCHER, kind, start, stop], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "DATACACHE_HOME": str(home)})
    assert proc.stdout.readline().strip() == "ready"
    first: list[str] = []
    while not first or first[-1].strip() != "=====":
        line = proc.stdout.readline()
        if not line:  # it ended: tables() reports what it printed
            break
        first.append(line)
    proc.first = "".join(first)
    return proc


def tables(proc: subprocess.Popen) -> list[str]:
    out, _ = proc.communicate(timeout=150)
    return [t.strip() for t in (proc.first + out).split("=====") if t.strip()]


def phase_of(table: str, name: str) -> str:
    header, *rows = table.splitlines()
    start = header.index("PHASE")
    row = next(r for r in rows if r.split()[0] == name)
    return row[start:].split()[0]


def test_sync_shows_updating_to_another_process_then_bound_then_failed(datacache_home, s3_bucket, moto_server,
                                                                       moto_secrets):
    fs, bucket = s3_bucket
    for i in range(3):
        fs.pipe(f"{bucket}/d/{i}.bin", os.urandom(1000 + i))
    with DelayProxy(moto_server.endpoint_url, latency_ms=2500, bandwidth_mbps=0) as proxy:
        mount = s3_mount(moto_server, bucket)
        mount["options"]["endpoint_url"] = proxy.endpoint_url  # each S3 request waits longer than a loaded `get`
        plane = apply_dataset(datacache_home, "slow", [mount], block_size="64Ki")
        assert plane.refresh_status("Dataset", "slow")["phase"] == "Bound"
        fs.pipe(f"{bucket}/d/new.bin", b"x" * 10)
        watcher = watch(datacache_home, "datasets", "Updating", "Bound")
        diff = plane.sync("slow")
        seen = [phase_of(t, "slow") for t in tables(watcher)]
    assert diff.counts == (1, 0, 0)
    assert "Updating" in seen and seen[-1] == "Bound", seen
    assert seen.index("Updating") < len(seen) - 1
    assert not syncmark.is_running(str(datacache_home / "datasets" / "default" / "slow"))

    # The proxy is gone: the sync fails, the old manifest (4 files) stays in use, and status says why.
    with pytest.raises(ResourceError, match="cannot list the mountPoint") as caught:
        plane.sync("slow")
    status = plane.refresh_status("Dataset", "slow")
    assert status["phase"] == "Failed" and status["fileNum"] == 4
    cond = status["conditions"][0]
    assert cond["reason"] == "SyncFailed" and cond["message"].startswith("metadata sync failed: ")
    assert str(caught.value) in cond["message"] and "testing" not in cond["message"]  # no secret
    assert sorted(e.path for e in plane.load_manifest(plane.get("Dataset", "slow"))) == [
        "d/0.bin", "d/1.bin", "d/2.bin", "d/new.bin"]


def targets_of(table: str) -> tuple[str, dict[str, tuple[str, str]]]:
    """``(phase, {target path: (loaded, total)})`` of the one DataLoad in a wide table."""
    header, row = table.splitlines()
    phase = row[header.index("PHASE"):].split()[0]
    cells = row[header.index("TARGETS"):].split()[0].split(",") if len(row) > header.index("TARGETS") else []
    return phase, {c.split("=")[0]: tuple(c.split("=")[1].split("/")) for c in cells}


def test_dataload_per_target_progress_is_visible_mid_run(datacache_home, s3_bucket, moto_server, moto_secrets):
    fs, bucket = s3_bucket
    fs.pipe(f"{bucket}/a/0.bin", os.urandom(100 * KiB))
    fs.pipe(f"{bucket}/a/1.bin", os.urandom(100 * KiB))
    fs.pipe(f"{bucket}/b/big.bin", os.urandom(3 << 20))
    with DelayProxy(moto_server.endpoint_url, latency_ms=20, bandwidth_mbps=0.1) as proxy:  # big.bin: ~2 s over 16 GETs
        mount = s3_mount(moto_server, bucket)
        mount["options"]["endpoint_url"] = proxy.endpoint_url
        plane = apply_dataset(datacache_home, "prog", [mount], block_size="64Ki")
        watcher = watch(datacache_home, "dataloads", "Executing", "Complete")
        _, result = plane.warmup("prog", ["/a", "/b"])
        seen = [targets_of(t) for t in tables(watcher) if "PHASE" in t]
    assert result.ok
    a, b = format_bytes(200 * KiB), format_bytes(3 << 20)
    final = ("Complete", {"/a": (a, a), "/b": (b, b)})
    assert seen[-1] == final, seen
    # Mid-run, from another process: /a loaded (in part or whole) while /b is not yet.
    mid = [t for phase, t in seen if phase == "Executing" and t]
    assert any(t["/a"][0] != "0B" and t["/b"][0] != b for t in mid), seen
    assert all(t["/a"][1] == a and t["/b"][1] == b for t in mid), seen


@pytest.fixture
def small_device(tmp_path):
    """A 3 MiB tmpfs under tmp_path (needs root and mount(8), as CI has), unmounted afterwards."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    path = tmp_path / "small-device"
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m,mode=0700", "tmpfs", str(path)], check=True)
    yield str(path)
    subprocess.run(["umount", "-l", str(path)], check=False)


def local_files(root, count: int, size: int) -> None:
    root.mkdir()
    for i in range(count):
        (root / f"{i}.bin").write_bytes(os.urandom(size))


def test_warmup_says_why_the_cache_did_not_keep_blocks(datacache_home, tmp_path, small_device):
    local_files(tmp_path / "src", 8, 1 << 20)
    mounts = [{"name": "local", "mountPoint": str(tmp_path / "src")}]
    # Quota: a 256 KiB block never fits a 200 KiB quota.
    plane = apply_dataset(datacache_home, "quota", mounts, [{"mediumtype": "SSD", "path": "q", "quota": "200Ki"}],
                          block_size="256Ki")
    _, result = plane.warmup("quota", ["/0.bin"])
    assert result.targets[0].failures == ["0.bin: a block of 262144 bytes does not fit in the cache quota: raise "
                                          "tieredstore.levels[].quota"]

    # Full device: a 1 GiB quota on a 3 MiB device.
    plane = apply_dataset(datacache_home, "full", mounts, [{"mediumtype": "SSD", "path": small_device,
                                                            "quota": "1Gi"}], block_size="64Ki")
    _, result = plane.warmup("full", [])
    (target,) = result.targets
    assert target.phase == "Failed"
    # a file not stored, or stored and then evicted to make room: the device is named either way
    assert target.failures and all(
        "the cache device is full or short of its free-space reserve (before the quota): free space on it, or "
        "lower tieredstore.levels[].quota or tieredstore.levels[].freeSpaceRatio" in f
        for f in target.failures if not f.startswith("... and")), target.failures

    # Unhealthy tier: the cache directory turns read-only under an open store (a read-only bind mount).
    plane = apply_dataset(datacache_home, "ro", mounts, [{"mediumtype": "SSD", "path": "ro", "quota": "1Gi"}],
                          block_size="64Ki")
    client = plane.open_dataset("ro")
    path = client.source.store.levels[0].path
    try:
        subprocess.run(["mount", "--bind", path, path], check=True)
        subprocess.run(["mount", "-o", "remount,bind,ro", path], check=True)
        (target,) = warmup(client, ["/0.bin"]).targets
    finally:
        subprocess.run(["umount", "-l", path], check=False)
        client.close()
    assert target.phase == "Failed"
    (failure,) = target.failures
    assert failure.startswith(f"0.bin: the cache tier {path} (SSD) is unhealthy: a write failed: [Errno 30] "
                              "Read-only file system"), failure
    assert failure.endswith(": fix the device; writes are tried again after a while"), failure


def test_a_runtime_whose_only_tier_cannot_be_opened_is_not_ready_and_says_why(datacache_home, tmp_path):
    # /proc takes no directories, even from root: the tier never opens. It used to show Ready.
    local_files(tmp_path / "src", 2, 100_000)
    mounts = [{"name": "local", "mountPoint": str(tmp_path / "src")}]
    plane = apply_dataset(datacache_home, "nocache", mounts,
                          [{"mediumtype": "SSD", "path": "/proc/datacache-nope", "quota": "64Mi"}], block_size="64Ki")
    apply_dataset(datacache_home, "fine", mounts, [{"mediumtype": "MEM", "quota": "64Mi"}], block_size="64Ki")
    status = plane.refresh_status("CacheRuntime", "nocache")
    tier = "/proc/datacache-nope/default/nocache"
    why = ("cannot be opened: [Errno 2] No such file or directory: '/proc/datacache-nope': "  # not "make it writable"
           "set the CacheRuntime's tieredstore.levels[].path to a writable directory")
    assert status["phase"] == "NotReady" and status["readyWorkers"] == 0
    assert status["workers"][0]["unhealthyTiers"] == [{"medium": "SSD", "path": tier, "reason": why}]
    (tiers,) = [c for c in status["conditions"] if c["type"] == "CacheTiersHealthy"]
    assert (tiers["status"], tiers["reason"]) == ("False", "TierUnhealthy")
    assert tiers["message"] == ("cache tier cannot be written, the blocks it would hold are read from the UFS: worker "
                                f"nocache-in-process: SSD tier {tier} ({why})")
    _, result = plane.warmup("nocache", [])
    assert result.targets[0].failures == [
        f"{i}.bin: the cache tier {tier} (SSD) is unhealthy: {why}; writes are tried again after a while"
        for i in range(2)]
    fine = plane.refresh_status("CacheRuntime", "fine")  # the other runtime: Ready, its tiers take writes
    assert fine["phase"] == "Ready"
    assert [(c["type"], c["status"]) for c in fine["conditions"]] == [("Ready", "True"), ("CacheTiersHealthy", "True")]
    # `get` observes every runtime's tiers; the unusable one's warning used to print on each `get`,
    # for other kinds too: its status (NotReady, the condition above) already says it.
    rows = {}
    for kind in ("runtimes", "datasets"):
        r = subprocess.run([sys.executable, "-m", "datacache", "get", kind], capture_output=True, text=True,
                           timeout=120, env={**os.environ, "DATACACHE_HOME": str(datacache_home)})
        assert (r.returncode, r.stderr) == (0, ""), r.stderr
        rows[kind] = {line.split()[0]: line.split() for line in r.stdout.splitlines()[1:]}
        assert sorted(rows[kind]) == ["fine", "nocache"]
    assert "NotReady" in rows["runtimes"]["nocache"] and "Ready" in rows["runtimes"]["fine"]
