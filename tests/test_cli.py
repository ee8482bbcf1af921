"""The CLI as a user runs it (a real subprocess): C7 names, C8 missing paths, C9 warmup targets,
status numbers, errors without tracebacks, secrets never printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from datacache.api.quantity import format_bytes
from support import dataset_yaml, disk_keys, s3_mount

NAMES = ["q?mark.txt", "per%cent.txt", "hash#tag.txt", "plus+sign.txt", "a space.txt", "é-accent.txt",
         "中文/文件.txt", "-leading-dash.txt"]


def dc(*args, home, check=False, env=None):
    proc = subprocess.run([sys.executable, "-m", "datacache", *args], capture_output=True, timeout=120,
                          env={**os.environ, "DATACACHE_HOME": str(home), **(env or {})})
    if check:
        assert proc.returncode == 0, proc.stderr.decode()
    return proc


@pytest.fixture
def named_dataset(datacache_home, s3_bucket, moto_server, moto_secrets, tmp_path):
    fs, bucket = s3_bucket
    local = tmp_path / "local"
    contents = {}
    for i, name in enumerate(NAMES):
        data = f"{name}:{i}\n".encode() * (i + 1)
        fs.pipe(f"{bucket}/{name}", data)
        contents[f"s3/{name}"] = data
        (local / os.path.dirname(name)).mkdir(parents=True, exist_ok=True)
        (local / name).write_bytes(data[::-1])
        contents[f"local/{name}"] = data[::-1]
    yaml_path = tmp_path / "ds.yaml"
    yaml_path.write_text(dataset_yaml("names", [s3_mount(moto_server, bucket, path="/s3"),
                                                {"name": "local", "mountPoint": str(local), "path": "/local"}],
                                      [{"mediumtype": "SSD", "path": "cache", "quota": "256Mi"}]))
    dc("apply", "-f", str(yaml_path), home=datacache_home, check=True)
    return contents


def test_c7_odd_names_round_trip_through_manifest_fsspec_and_cli(named_dataset, datacache_home):
    import fsspec

    from datacache.control.embedded import Embedded

    plane = Embedded(str(datacache_home))
    client = plane.open_dataset("names")
    assert sorted(e.path for e in client.manifest) == sorted(named_dataset)
    client.close()
    fs = fsspec.filesystem("datacache", home=str(datacache_home), skip_instance_cache=True)
    for path, data in named_dataset.items():
        assert fs.cat_file(f"names/{path}") == data
        assert fsspec.open(f"datacache://names/{path}", home=str(datacache_home)).open().read() == data
    assert sorted(fs.ls("names/s3/中文", detail=False)) == ["names/s3/中文/文件.txt"]
    fs.close()
    listing = dc("ls", "names/s3", home=datacache_home, check=True).stdout.decode().splitlines()
    assert sorted(listing) == sorted(n for n in NAMES if "/" not in n) + ["中文/"]
    for path, data in named_dataset.items():
        if path.startswith("s3/"):  # one CLI process per name: the S3 side covers every name
            assert dc("cat", f"names/{path}", home=datacache_home, check=True).stdout == data


def test_c8_cli_missing_path_is_a_clear_error(named_dataset, datacache_home):
    proc = dc("cat", "names/s3/nope.txt", home=datacache_home)
    assert proc.returncode == 1
    assert proc.stderr.decode().strip() == "error: s3/nope.txt: no such file or directory in dataset 'names'"
    proc = dc("cat", "names", home=datacache_home)
    assert proc.returncode == 1
    assert proc.stderr.decode().strip() == ("error: names: is a directory (the dataset's root): give DATASET/path "
                                            "of a file")
    proc = dc("ls", "nosuch", home=datacache_home)
    assert proc.returncode == 1 and "dataset default/nosuch not found" in proc.stderr.decode()
    assert b"Traceback" not in proc.stderr


def test_c9_warmup_missing_and_existing_targets(named_dataset, datacache_home):
    proc = dc("warmup", "-q", "names", "/s3/does-not-exist", "/local", home=datacache_home)
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 1
    assert "/s3/does-not-exist: Failed" in out
    assert "/local: Complete: 8 files" in out
    assert "warmup incomplete for: /s3/does-not-exist" in err
    doc = json.loads(dc("get", "dataloads", "-o", "json", home=datacache_home, check=True).stdout)["items"][0]
    assert doc["status"]["phase"] == "Failed"
    missing, local = doc["status"]["targets"]
    assert missing["phase"] == "Failed" and missing["failures"] == [
        "/s3/does-not-exist: no such file, directory or match in dataset 'names' as of its last metadata sync; "
        "a file added to the UFS since is listed after `datacache sync names` (or the Dataset's "
        "spec.autoSyncInterval)"]
    assert local["phase"] == "Complete" and local["cachedBytes"] == local["bytes"] == sum(
        len(v) for k, v in named_dataset.items() if k.startswith("local/"))


def test_status_numbers_equal_what_is_cached(named_dataset, datacache_home):
    dc("warmup", "-q", "names", "/local", home=datacache_home, check=True)
    status = json.loads(dc("get", "dataset", "names", "-o", "json", home=datacache_home, check=True).stdout)["status"]
    total = sum(len(v) for v in named_dataset.values())
    local = sum(len(v) for k, v in named_dataset.items() if k.startswith("local/"))
    assert status["fileNum"] == len(named_dataset)
    assert status["ufsTotal"] == format_bytes(total)
    assert status["cacheStates"]["cached"] == format_bytes(local)
    assert status["cacheStates"]["cachedPercentage"] == f"{1000 * local // total / 10:.1f}%"
    table = dc("get", "datasets", home=datacache_home, check=True).stdout.decode().splitlines()
    assert table[0].split() == ["NAME", "UFS", "TOTAL", "SIZE", "CACHED", "CACHE", "CAPACITY", "CACHED",
                                "PERCENTAGE", "PHASE", "AGE"]
    assert table[1].split()[:6] == ["names", format_bytes(total), format_bytes(local), "256.00MiB",
                                    f"{1000 * local // total / 10:.1f}%", "Bound"]


def test_bad_yaml_is_one_located_line_without_traceback(datacache_home, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: datacache.io/v1alpha1\nkind: Dataset\nmetadata: {name: x}\n"
                   "spec:\n  mounts:\n  - {name: a, mountPoint: 'foo://bucket'}\n")
    proc = dc("apply", "-f", str(bad), home=datacache_home)
    assert proc.returncode == 1
    err = proc.stderr.decode()
    assert err.startswith(f"error: {bad}: spec.mounts[0].mountPoint: unsupported scheme 'foo'")
    assert "Traceback" not in err
    assert json.loads(dc("get", "datasets", "-o", "json", home=datacache_home).stdout) == {"items": []}


def test_each_mistake_of_a_document_is_an_error_line_naming_the_resource(datacache_home, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: datacache.io/v1alpha1\nkind: Dataset\nmetadata: {name: demo}\n"
                   f"spec:\n  mounts:\n  - {{name: a, mountPoint: '{tmp_path}'}}\n---\n"
                   "apiVersion: datacache.io/v1alpha1\nkind: CacheRuntime\nmetadata: {name: demo}\nspec:\n"
                   "  replicas: -1\n  tieredstore:\n    levels:\n    - {mediumtype: SSD, path: /tmp/c, quota: lots}\n")
    proc = dc("apply", "-f", str(bad), home=datacache_home)
    where = f"error: {bad} (document 2, cacheruntime.datacache.io/demo): spec."
    assert (proc.returncode, proc.stdout) == (1, b"")
    lines = proc.stderr.decode().splitlines()  # the second and third lines had no `error:`
    assert [line.split(": ", 3)[2] for line in lines] == ["spec.replicas", "spec.tieredstore.levels[0].quota"]
    assert all(line.startswith(where) for line in lines), lines
    assert json.loads(dc("get", "datasets", "-o", "json", home=datacache_home).stdout) == {"items": []}


def test_secret_values_never_printed(named_dataset, datacache_home, monkeypatch):
    secret = "testing"  # the moto secret, set through DATACACHE_SECRET_MOTO_SECRET
    outputs = [dc(*args, home=datacache_home) for args in (
        ("get", "datasets", "-o", "yaml"), ("describe", "dataset", "names"), ("get", "runtimes", "-o", "json"),
        ("warmup", "names"), ("ls", "names/s3"))]
    for proc in outputs:
        assert proc.returncode == 0
        assert secret.encode() not in proc.stdout + proc.stderr
    # A missing secret is an error naming the reference and where to put it, not the value.
    env = {k: v for k, v in os.environ.items() if not k.startswith("DATACACHE_SECRET_MOTO")}
    proc = subprocess.run([sys.executable, "-m", "datacache", "sync", "names"], capture_output=True, env={
        **env, "DATACACHE_HOME": str(datacache_home)}, timeout=60)
    assert proc.returncode == 1
    assert "secret 'moto' key 'key' not found: set the environment variable DATACACHE_SECRET_MOTO_KEY" in \
        proc.stderr.decode()


def test_delete_refuses_a_mounted_dataset_unless_forced(datacache_home, tmp_path):
    from datacache.control.fuse_mounts import fuse_mounts_of, lazy_unmount

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_bytes(b"hello\n" * 1000)
    yaml_path = tmp_path / "ds.yaml"
    yaml_path.write_text(dataset_yaml("mnt", [{"name": "local", "mountPoint": str(tmp_path / "src")}],
                                      [{"mediumtype": "SSD", "path": "cache", "quota": "64Mi"}]))
    dc("apply", "-f", str(yaml_path), home=datacache_home, check=True)
    dc("warmup", "-q", "mnt", home=datacache_home, check=True)
    mountpoint = str(tmp_path / "mp")
    started = dc("mount", "mnt", mountpoint, "--background", home=datacache_home)
    assert started.returncode == 0, started.stderr.decode()
    try:
        with open(os.path.join(mountpoint, "a.txt"), "rb") as f:
            assert f.read() == b"hello\n" * 1000
        cache_dir = datacache_home / "cache" / "default" / "mnt"
        assert any(name.startswith("mnt/") for name in disk_keys(cache_dir))
        refused = dc("delete", "dataset", "mnt", home=datacache_home)
        assert refused.returncode == 1
        assert refused.stderr.decode() == (f"error: dataset default/mnt is mounted at {mountpoint}: unmount it first "
                                           f"(datacache unmount {mountpoint}) or delete with --force\n")
        assert dc("get", "dataset", "mnt", home=datacache_home).returncode == 0  # still there
        other = tmp_path / "other-home"  # another home's dataset of the same name is not the mounted one
        dc("apply", "-f", str(yaml_path), home=other, check=True)
        assert dc("delete", "dataset", "mnt", home=other, check=True).stdout.decode().startswith(
            "dataset.datacache.io/mnt deleted")

        forced = dc("delete", "dataset", "mnt", "--force", home=datacache_home)
        assert forced.stdout.decode() == ("dataset.datacache.io/mnt deleted (cacheruntime mnt stays, with its workers "
                                          "and cache: datacache delete cacheruntime mnt)\n"), forced.stderr.decode()
        assert fuse_mounts_of("default", "mnt") == []
        gone = dc("get", "dataset", "mnt", home=datacache_home)
        assert gone.returncode == 1 and "not found" in gone.stderr.decode()
        assert not any(name.startswith("mnt/") for name in disk_keys(cache_dir))
    finally:
        for path in fuse_mounts_of("default", "mnt"):
            lazy_unmount(path)


def test_controller_once_auto_syncs_and_wide_columns(datacache_home, tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_bytes(b"a" * 100)
    docs = dataset_yaml("auto", [{"name": "local", "mountPoint": str(tmp_path / "src")}],
                        [{"mediumtype": "SSD", "path": "cache", "quota": "64Mi"}])
    docs = docs.replace('"spec": {"mounts"', '"spec": {"autoSyncInterval": 1, "mounts"', 1)
    (tmp_path / "ds.yaml").write_text(docs)
    dc("apply", "-f", str(tmp_path / "ds.yaml"), home=datacache_home, check=True)
    (tmp_path / "src" / "b.txt").write_bytes(b"b" * 50)
    time.sleep(1.1)  # autoSyncInterval: 1 s since the apply's sync
    ran = dc("controller", "--once", home=datacache_home, check=True)
    assert "dataset default/auto synced: 1 added, 0 changed, 0 deleted" in ran.stderr.decode()
    table = dc("get", "datasets", "-o", "wide", home=datacache_home, check=True).stdout.decode().splitlines()
    assert table[0].split()[-8:] == ["AGE", "FILES", "CACHE", "HIT", "RATIO", "LAST", "TRACE", "CACHED"]
    assert table[1].split()[:6] == ["auto", "150B", "0B", "64.00MiB", "0.0%", "Bound"]
    assert table[1].split()[-3:] == ["2", "0.0%", "-"]  # no run recorded

