"""What a new user met in the first hour (issue 19), each through the real ``datacache`` command
(a subprocess): its output, exit status and the status fields it prints."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys

import pytest

from support import dataset_yaml, s3_mount
from test_cli import dc

LEVELS = [{"mediumtype": "SSD", "path": "cache", "quota": "64Mi"}]


def local_dataset(tmp_path, home, name: str, files: dict[str, bytes], block_size: str = "64Ki") -> str:
    """Apply Dataset + CacheRuntime ``name`` over a local directory holding ``files``; returns
    the source directory."""
    src = tmp_path / f"{name}-src"
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    path = tmp_path / f"{name}.yaml"
    path.write_text(dataset_yaml(name, [{"name": "local", "mountPoint": str(src)}], LEVELS, block_size=block_size))
    dc("apply", "-f", str(path), home=home, check=True)
    return str(src)


def _processes_naming(text: str) -> list[int]:
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    pids.append(int(pid))
        except OSError:
            pass
    return pids


# 19.5 -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("background", [True, False], ids=["background", "foreground"])
def test_a_mount_point_that_cannot_be_made_is_one_line_naming_path_and_fix(background, datacache_home, tmp_path):
    src = local_dataset(tmp_path, datacache_home, "photos", {"train.parquet": b"x" * 100})
    under_file = f"{src}/train.parquet/sub"
    cases = {
        under_file: f"error: cannot create mount point {under_file}: {src}/train.parquet is a file, not a "
                    "directory; give a path under a directory (e.g. /mnt/NAME)\n",
        "/proc/nonexist/x": "error: cannot create mount point /proc/nonexist/x: No such file or directory: "
                            "/proc/nonexist; give a path under a directory you can write to (e.g. /mnt/NAME), or "
                            "create it first\n",
        f"{src}/train.parquet": f"error: {src}/train.parquet exists and is not a directory: give an empty "
                                "directory as the mount point (or a path to create)\n",
    }
    for mountpoint, expected in cases.items():
        proc = dc("mount", "photos", mountpoint, *(["--background"] if background else []), home=datacache_home)
        assert (proc.returncode, proc.stderr.decode(), proc.stdout) == (1, expected, b""), mountpoint
        assert _processes_naming(mountpoint) == []  # no daemon left behind
        with open("/proc/mounts") as f:
            assert mountpoint not in f.read()
    assert not os.path.exists("/proc/nonexist")


# 19.6 -------------------------------------------------------------------------------------------
def test_cached_percentage_rounds_down_and_is_100_only_when_all_is_cached(datacache_home, tmp_path):
    from datacache.control.embedded import Embedded

    a, b = os.urandom((64 << 10) + 1), b"0123456789"  # a.bin: a full block and one byte
    local_dataset(tmp_path, datacache_home, "photos", {"a.bin": a, "b.bin": b})
    dc("warmup", "-q", "photos", "/a.bin", home=datacache_home, check=True)
    # 65537 of 65547 bytes: 99.98 %, which one-decimal rounding showed as 100.0%
    row = dc("get", "datasets", home=datacache_home, check=True).stdout.decode().splitlines()[1].split()
    assert row[1:6] == ["64.01KiB", "64.00KiB", "64.00MiB", "99.9%", "Bound"]
    assert dc("ls", "-l", "photos", home=datacache_home, check=True).stdout.decode().splitlines() == [
        f"{len(a):>12}   100.0%  a.bin", f"{len(b):>12}     0.0%  b.bin"]

    client = Embedded(str(datacache_home)).open_dataset("photos")  # drop a.bin's one-byte block
    try:
        assert client.source.store.delete_prefix(str(client.source.key(client.stat("a.bin"), 1))) == 1
    finally:
        client.close()
    assert dc("ls", "-l", "photos/a.bin", home=datacache_home, check=True).stdout.decode() == \
        f"{len(a):>12}    99.9%  a.bin\n"  # 65536 of 65537 bytes
    dc("warmup", "-q", "photos", home=datacache_home, check=True)
    row = dc("get", "datasets", home=datacache_home, check=True).stdout.decode().splitlines()[1].split()
    assert row[1:6] == ["64.01KiB", "64.01KiB", "64.00MiB", "100.0%", "Bound"]


# 19.8 -------------------------------------------------------------------------------------------
def test_a_failed_dataset_shows_its_runtimes_capacity_and_an_unbound_one_none(datacache_home, tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text(dataset_yaml("broken", [{"name": "local", "mountPoint": str(tmp_path / "missing")}], LEVELS))
    assert dc("apply", "-f", str(path), home=datacache_home).returncode == 1  # its first sync fails
    alone = tmp_path / "alone.yaml"  # a Dataset without a runtime
    (tmp_path / "alone").mkdir()
    (tmp_path / "alone" / "x").write_bytes(b"x" * 1000)
    alone.write_text(dataset_yaml("alone", [{"name": "local", "mountPoint": str(tmp_path / "alone")}],
                                  LEVELS).split("---")[0])
    dc("apply", "-f", str(alone), home=datacache_home, check=True)
    rows = [r.split() for r in dc("get", "datasets", home=datacache_home, check=True).stdout.decode().splitlines()]
    assert rows[0][:8] == ["NAME", "UFS", "TOTAL", "SIZE", "CACHED", "CACHE", "CAPACITY", "CACHED"]
    by_name = {r[0]: r for r in rows[1:]}
    assert by_name["broken"][1:6] == ["0B", "-", "64.00MiB", "-", "Failed"]
    assert by_name["alone"][1:6] == ["1000B", "0B", "-", "0.0%", "NotBound"]
    # listed without a runtime: the namespace needs none, and nothing of it is cached
    assert dc("ls", "-l", "alone", home=datacache_home, check=True).stdout.decode().split() == ["1000", "0.0%", "x"]
    unsynced = dc("ls", "broken", home=datacache_home)  # never synced: listing syncs it, and says why not
    assert unsynced.returncode == 1 and unsynced.stderr.decode().strip() == (
        f"error: dataset 'broken': spec.mounts[0] ('local'): mountPoint '{tmp_path / 'missing'}' does not "
        "exist in the UFS: fix the mountPoint or create it")


def test_cache_capacity_is_what_a_smaller_device_holds_not_the_quota(datacache_home, tmp_path, small_tmpfs):
    src = tmp_path / "src"
    src.mkdir()
    (src / "x").write_bytes(os.urandom(100_000))
    path = tmp_path / "small.yaml"
    path.write_text(dataset_yaml("small", [{"name": "local", "mountPoint": str(src)}],
                                 [{"mediumtype": "SSD", "path": str(small_tmpfs), "quota": "1Gi"}]))
    dc("apply", "-f", str(path), home=datacache_home, check=True)
    dc("warmup", "small", home=datacache_home, check=True)
    rows = [r.split() for r in dc("get", "datasets", home=datacache_home, check=True).stdout.decode().splitlines()]
    shown = {r[0]: r for r in rows[1:]}["small"][3]
    # what the tier holds (blocks and index, all under the tmpfs) plus the room above the 1 % reserve
    held = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(small_tmpfs) for f in fs)
    st = os.statvfs(small_tmpfs)
    can_hold = held + st.f_bavail * st.f_frsize - st.f_blocks * st.f_frsize // 100
    assert shown.endswith("MiB") and abs(float(shown[:-3]) * 2**20 - can_hold) < 64 << 10, (shown, can_hold)
    assert can_hold < 6 << 20  # the quota (1.00GiB) was shown before


# 19.9, 19.10 ------------------------------------------------------------------------------------
TTY = {"TTY_COMPATIBLE": "1", "COLUMNS": "150"}  # rich draws the bar as on a terminal


def test_warmup_bar_rate_is_the_summarys_rate(datacache_home, tmp_path):
    local_dataset(tmp_path, datacache_home, "photos", {f"{i}.bin": os.urandom(300_000) for i in range(8)})
    proc = dc("warmup", "photos", home=datacache_home, env=TTY, check=True)
    # The bar used to count from before the dataset was opened: 3.90 MiB/s against 62.75 MiB/s.
    [summary_rate] = re.findall(r"loaded from the UFS \(([^)]*)\)", proc.stdout.decode())
    bar_rates = re.findall(r"([0-9.]+[KMGT]?i?B/s)", proc.stderr.decode())
    assert bar_rates and bar_rates[-1] == summary_rate, (bar_rates, proc.stdout.decode())
    assert "2.29MiB of 2.29MiB cached" in proc.stdout.decode()


def test_warmup_of_a_failed_dataset_says_why_before_any_bar(datacache_home, tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text(dataset_yaml("broken", [{"name": "local", "mountPoint": str(tmp_path / "missing")}], LEVELS))
    assert dc("apply", "-f", str(path), home=datacache_home).returncode == 1  # its first sync fails: Failed
    proc = dc("warmup", "broken", home=datacache_home, env=TTY)
    assert (proc.returncode, proc.stdout) == (1, b"")
    assert proc.stderr.decode() == (  # no `0/? files` bar before it
        f"error: dataset 'broken': spec.mounts[0] ('local'): mountPoint '{tmp_path / 'missing'}' does not exist in "
        "the UFS: fix the mountPoint or create it\n")


@pytest.mark.parametrize("background", [True, False], ids=["background", "foreground"])
def test_mount_of_a_failed_dataset_says_why_and_creates_nothing(background, datacache_home, tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text(dataset_yaml("broken", [{"name": "local", "mountPoint": str(tmp_path / "missing")}], LEVELS))
    assert dc("apply", "-f", str(path), home=datacache_home).returncode == 1  # its first sync fails: Failed
    mountpoint = str(tmp_path / "mnt" / "broken")
    proc = dc("mount", "broken", mountpoint, *(["--background"] if background else []), home=datacache_home)
    # The daemon used to start, fail in its log, and leave the mount point it had created.
    assert (proc.returncode, proc.stdout, proc.stderr.decode()) == (1, b"", (
        f"error: dataset 'broken': spec.mounts[0] ('local'): mountPoint '{tmp_path / 'missing'}' does not exist in "
        "the UFS: fix the mountPoint or create it\n"))
    assert not os.path.exists(tmp_path / "mnt") and _processes_naming(mountpoint) == []


# 19.12 ------------------------------------------------------------------------------------------
def test_a_foreground_mount_says_where_it_is_and_how_to_stop_once_it_answers(datacache_home, tmp_path):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "fuse"))
    from fuse_support import HAVE_FUSE, SKIP_REASON, force_cleanup, is_listed

    if not HAVE_FUSE:
        pytest.skip(SKIP_REASON)
    data = os.urandom(100_000)
    local_dataset(tmp_path, datacache_home, "photos", {"train/a.jpg": data})
    mountpoint = str(tmp_path / "mnt")
    proc = subprocess.Popen([sys.executable, "-m", "datacache", "mount", "photos", mountpoint],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "DATACACHE_HOME": str(datacache_home)})
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready, "the foreground mount printed nothing within 60 s"
        line = proc.stdout.readline().decode()
        assert re.fullmatch(rf"mounted default/photos at {re.escape(mountpoint)} \(read-only, no-open mode, "
                            r"cache SSD 64\.00MiB\), Ctrl-C to unmount\n", line), line
        mode = proc.stdout.readline().decode()  # a tree of small files: no-open, and why
        assert re.fullmatch(r"read mode: no-open: opening a file costs no request to the daemon, best for many "
                            r"small files \(0% of 97\.66KiB in files over 4\.00MiB; --read-mode passthrough "
                            r"suits large files\)\n", mode), mode
        assert os.listdir(mountpoint) == ["train"]  # it answers as soon as it says so
        with open(os.path.join(mountpoint, "train", "a.jpg"), "rb") as f:
            assert f.read() == data
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0 and proc.stdout.read() == b""
        assert not is_listed(mountpoint)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        force_cleanup(str(datacache_home), mountpoint)


# 19.15 ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["data", ""], ids=["prefix", "bucket"])
def test_a_missing_bucket_is_named_as_written_with_its_scheme(key, datacache_home, tmp_path, moto_server,
                                                              moto_secrets):
    url = f"s3://no-such-bucket/{key}".rstrip("/")
    path = tmp_path / "nb.yaml"
    path.write_text(dataset_yaml("nb", [s3_mount(moto_server, "no-such-bucket", key)], LEVELS))
    message = (f"dataset 'nb': spec.mounts[0] ('s3'): mountPoint '{url}' does not exist in the UFS: fix the "
               "mountPoint or create it\n")
    proc = dc("apply", "-f", str(path), home=datacache_home)
    assert proc.returncode == 1
    assert proc.stderr.decode().startswith(f"error: dataset.datacache.io/nb: stored, but failed: {message}hint: ")
    proc = dc("sync", "nb", home=datacache_home)
    assert proc.returncode == 1 and proc.stderr.decode() == f"error: {message}"


# 19.16 ------------------------------------------------------------------------------------------
def test_apply_again_after_a_failed_first_sync_is_configured_and_delete_f_undoes_an_apply(datacache_home,
                                                                                         tmp_path):
    src = tmp_path / "photos"
    path = tmp_path / "photos.yaml"
    path.write_text(dataset_yaml("photos", [{"name": "local", "mountPoint": str(src)}], LEVELS))
    first = dc("apply", "-f", str(path), home=datacache_home)  # the directory is not there yet
    assert first.returncode == 1
    assert first.stdout.decode() == "dataset.datacache.io/photos created\ncacheruntime.datacache.io/photos created\n"
    assert first.stderr.decode().splitlines()[1] == (
        f"hint: fix {path} and apply again, or remove what it stored: datacache delete -f {path}")

    src.mkdir()
    (src / "a.jpg").write_bytes(b"x" * 1000)
    again = dc("apply", "-f", str(path), home=datacache_home, check=True)  # same file: it syncs now
    assert again.stdout.decode() == ("dataset.datacache.io/photos configured\n"
                                     "cacheruntime.datacache.io/photos unchanged\n")
    row = dc("get", "datasets", home=datacache_home, check=True).stdout.decode().splitlines()[1].split()
    assert row[:2] == ["photos", "1000B"] and row[5] == "Bound"
    assert dc("apply", "-f", str(path), home=datacache_home, check=True).stdout.decode() == (
        "dataset.datacache.io/photos unchanged\ncacheruntime.datacache.io/photos unchanged\n")

    gone = dc("delete", "-f", str(path), home=datacache_home, check=True)  # one command, as kubectl delete -f
    assert gone.stdout.decode() == "dataset.datacache.io/photos deleted\ncacheruntime.datacache.io/photos deleted\n"
    for kind in ("datasets", "cacheruntimes"):
        listed = dc("get", kind, home=datacache_home, check=True).stdout.decode()
        assert listed.startswith("No ") and "resources found" in listed
    assert not os.path.exists(datacache_home / "cache" / "default" / "photos")  # its cache went with it
    twice = dc("delete", "-f", str(path), home=datacache_home)  # said as kubectl does, not "apply it first"
    assert twice.returncode == 1 and twice.stdout == b""
    assert twice.stderr.decode().splitlines() == [
        "error: dataset default/photos not found (already deleted?); see 'datacache get datasets'",
        "error: cacheruntime default/photos not found (already deleted?); see 'datacache get cacheruntimes'"]
    quiet = dc("delete", "-f", str(path), "--ignore-not-found", home=datacache_home, check=True)
    assert quiet.stdout == b"" and quiet.stderr == b""


# 18.5 -------------------------------------------------------------------------------------------
def test_warmup_of_an_empty_source_directory_is_complete_with_nothing_to_load(datacache_home, tmp_path):
    src = local_dataset(tmp_path, datacache_home, "dlio", {"train/a.npz": b"x" * 5000})
    os.makedirs(os.path.join(src, "valid", "sub"))  # DLIO generates an empty valid/
    dc("sync", "dlio", home=datacache_home, check=True)
    proc = dc("warmup", "-q", "dlio", "/valid", "/train", home=datacache_home)
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
    lines = proc.stdout.decode().splitlines()
    assert lines[1:] == ["  /valid: Complete: 0 files, 0B of 0B cached",
                         "  /train: Complete: 1 file, 4.88KiB of 4.88KiB cached"]
    missing = dc("warmup", "-q", "dlio", "/nothere", home=datacache_home)  # what was never there still fails
    # nothing selected: only why, on stderr (no empty bar, no summary of nothing)
    assert (missing.returncode, missing.stdout) == (1, b"")
    assert missing.stderr.decode().startswith("error: /nothere: no such file, directory or match in dataset 'dlio'")
    assert len(missing.stderr.decode().splitlines()) == 1


def test_cached_files_read_without_the_ufs_credentials(datacache_home, tmp_path, moto_server, s3_bucket):
    """19.11: a reader of cached data needs no UFS secret; an uncached file then fails with one
    line naming the missing secret (never its value, never a traceback)."""
    s3, bucket = s3_bucket
    cached, cold = os.urandom(300_000), os.urandom(5000)
    s3.pipe(f"{bucket}/cached.bin", cached)
    s3.pipe(f"{bucket}/cold.bin", cold)
    path = tmp_path / "creds.yaml"
    path.write_text(dataset_yaml("creds", [s3_mount(moto_server, bucket)], LEVELS, block_size="64Ki"))
    secrets = {"DATACACHE_SECRET_MOTO_KEY": "testing", "DATACACHE_SECRET_MOTO_SECRET": "testing"}
    dc("apply", "-f", str(path), home=datacache_home, check=True, env=secrets)
    dc("warmup", "-q", "creds", "/cached.bin", home=datacache_home, check=True, env=secrets)
    bare = {k: v for k, v in os.environ.items() if not k.startswith("DATACACHE_SECRET_")}
    read = subprocess.run([sys.executable, "-m", "datacache", "cat", "creds/cached.bin"], capture_output=True,
                          timeout=120, env={**bare, "DATACACHE_HOME": str(datacache_home)})
    assert read.returncode == 0, read.stderr.decode()
    assert read.stdout == cached
    missing = subprocess.run([sys.executable, "-m", "datacache", "cat", "creds/cold.bin"], capture_output=True,
                             timeout=120, env={**bare, "DATACACHE_HOME": str(datacache_home)})
    err = missing.stderr.decode()
    assert missing.returncode == 1 and missing.stdout == b""
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert "moto" in err and "testing" not in err


def test_warmup_of_a_file_changed_since_the_sync_loads_its_current_version(datacache_home, tmp_path):
    """A file rewritten in the UFS after the last sync: warmup re-reads its entry (as a reader's
    ESTALE does) and caches the current version, instead of failing the same way every run."""
    old = os.urandom(200_000)
    src = local_dataset(tmp_path, datacache_home, "changed", {"val/a.bin": old, "val/b.bin": os.urandom(1000)})
    new = os.urandom(150_000)
    with open(os.path.join(src, "val", "a.bin"), "r+b") as f:  # in place, as an editor would not
        f.write(new)
        f.truncate()
    run = dc("warmup", "changed", "/val", home=datacache_home)
    out = run.stdout.decode() + run.stderr.decode()
    assert run.returncode == 0, out
    assert "/val: Complete: 2 files" in out
    assert dc("cat", "changed/val/a.bin", home=datacache_home, check=True).stdout == new
    assert dc("cat", "datacache://changed/val/a.bin", home=datacache_home, check=True).stdout == new  # a URL too
    listing = dc("ls", "-l", "changed/val", home=datacache_home, check=True).stdout.decode().split("\n")
    assert listing[0].split() == ["150000", "100.0%", "a.bin"]  # the manifest names the current version


def test_a_failed_warmups_bar_ends_at_what_is_cached(datacache_home, tmp_path):
    # 80 MiB into a 64 MiB quota: the bar used to end full (80.0/80.0 MiB) above a Failed summary
    local_dataset(tmp_path, datacache_home, "big", {f"{i}.bin": os.urandom(10 << 20) for i in range(8)})
    proc = dc("warmup", "big", home=datacache_home, env=TTY)
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 1 and "/: Failed: 8 files" in out, out
    [cached] = re.findall(r"/: Failed: 8 files, ([0-9.]+)MiB of 80.00MiB cached", out)
    done, total = re.findall(r"([0-9.]+)/([0-9.]+) MiB", err)[-1]
    assert float(total) == 80.0 and 0 < float(cached) < 64, (out, err)
    assert abs(float(done) - float(cached)) <= 0.05, (done, cached)
    assert re.findall(r"(\d+)/8 files", err)[-1] != "8"
