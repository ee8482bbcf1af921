"""What a fresh user following the README (embedded mode) met, each as the real CLI (a subprocess)
or the Embedded API shows it: --report-status outside a cluster, apply of a broken file, Cron
seconds, replicas 0, a closed stdout pipe, condition times, what delete leaves, the warmup bar,
mount errors, the controller's log."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from datacache.api.quantity import format_bytes
from datacache.control.dataloads import next_fire, parse_iso
from datacache.control.embedded import Embedded
from datacache.state import StateStore, iso
from support import dataset_yaml

ROOT = os.path.join(os.path.dirname(__file__), os.pardir)
LEVELS = [{"mediumtype": "SSD", "path": "cache", "quota": "64Mi"}]
NO_KUBE = ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "DATACACHE_WORKER_TOKEN")


def dc(*args, home, env=None, drop=(), check=False):
    environ = {k: v for k, v in os.environ.items() if k not in drop}
    proc = subprocess.run([sys.executable, "-m", "datacache", *args], capture_output=True, timeout=120,
                          env={**environ, "DATACACHE_HOME": str(home), **(env or {})})
    if check:
        assert proc.returncode == 0, proc.stderr.decode()
    return proc


def local_dataset(tmp_path, home, name: str, files: dict[str, bytes], spec: dict | None = None) -> str:
    """Apply Dataset + CacheRuntime ``name`` over a local directory holding ``files``; returns the
    YAML file's path."""
    src = tmp_path / f"{name}-src"
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    text = dataset_yaml(name, [{"name": "local", "mountPoint": str(src)}], LEVELS, block_size="64Ki")
    if spec:
        ds, rt = text.split("\n---\n")
        doc = json.loads(ds)
        doc["spec"].update(spec)
        text = json.dumps(doc) + "\n---\n" + rt
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    dc("apply", "-f", str(path), home=home, check=True)
    return str(path)


# 1 ----------------------------------------------------------------------------------------------
def test_report_status_outside_a_cluster_fails_first_with_no_api_access(datacache_home, tmp_path):
    path = tmp_path / "photos.yaml"
    path.write_text(dataset_yaml("photos", [{"name": "local", "mountPoint": str(tmp_path)}], LEVELS))
    proc = dc("sync", "photos", "-f", str(path), "--report-status", "kubernetes", home=datacache_home,
              env={"HOME": str(tmp_path)}, drop=NO_KUBE)
    assert proc.returncode == 1
    err = proc.stderr.decode()
    assert err.startswith("error: --report-status kubernetes: no Kubernetes API access (") and err.count("\n") == 1
    assert err.endswith("run it in the operator's sync Job (its ServiceAccount) or set KUBECONFIG\n")
    assert proc.stdout == b"" and not (datacache_home / "datasets").exists()  # nothing done before the check


def test_report_status_of_a_runtime_without_workers_needs_no_worker_token(datacache_home, tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.bin").write_bytes(b"a" * 1000)
    path = tmp_path / "photos.yaml"
    path.write_text(dataset_yaml("photos", [{"name": "local", "mountPoint": str(tmp_path / "src")}], LEVELS))
    kubeconfig = tmp_path / "kubeconfig"  # an API server nobody listens on: the token is needed before it
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}]}))
    proc = dc("sync", "photos", "-f", str(path), "--report-status", "kubernetes", home=datacache_home,
              env={"KUBECONFIG": str(kubeconfig)}, drop=NO_KUBE)
    assert proc.stdout.decode() == "dataset.datacache.io/photos synced: 1 added, 0 changed, 0 deleted\n"
    assert proc.returncode == 1
    assert proc.stderr.decode() == ("error: --report-status kubernetes: patch dataset default/photos status: "
                                    "API server unreachable ([Errno 111] Connection refused)\n")
    assert not (datacache_home / "runtimes" / "default" / "photos" / "token").exists()


# 2 ----------------------------------------------------------------------------------------------
def test_apply_of_an_example_with_unfilled_placeholders_stores_nothing_and_says_how(datacache_home):
    proc = dc("apply", "-f", os.path.join(ROOT, "examples", "demo-dataset.yaml"), home=datacache_home)
    assert proc.returncode == 1 and proc.stdout == b""
    lines = proc.stderr.decode().splitlines()
    assert lines[1].endswith("(document 1, dataset.datacache.io/demo): spec.mounts[1].mountPoint: '${LOCAL_DIR}' "
                             "holds the unfilled placeholder(s) ${LOCAL_DIR}: replace them with your own values (the comment at the "
                             "top of the example file says what each one is)")
    assert "neither a URL" not in proc.stderr.decode()
    proc = dc("apply", "-f", os.path.join(ROOT, "examples", "thin-sftp.yaml"), home=datacache_home)
    assert proc.returncode == 1 and proc.stdout == b""
    assert ("spec.mounts[0].mountPoint: 'sftp://${SFTP_USER}@${SFTP_HOST}:${SFTP_PORT}${SFTP_PATH}' holds the "
            "unfilled placeholder(s) ${SFTP_USER}, ${SFTP_HOST}, ${SFTP_PORT}, ${SFTP_PATH}") in proc.stderr.decode()
    state = StateStore(str(datacache_home))
    assert [state.list(kind) for kind in ("Dataset", "CacheRuntime", "ThinRuntime", "ThinRuntimeProfile")] == [[]] * 4
    state.close()


def test_apply_reports_each_document_and_applies_the_others_when_one_fails(datacache_home, tmp_path):
    mount = {"name": "s3", "mountPoint": "s3://bucket", "options": {"endpoint_url": "http://127.0.0.1:1"},
             "encryptOptions": [{"name": "key", "valueFrom": {"secretKeyRef": {"name": "nokey", "key": "k"}}}]}
    path = tmp_path / "ds.yaml"
    path.write_text(dataset_yaml("half", [mount], LEVELS))
    proc = dc("apply", "-f", str(path), home=datacache_home, drop=("DATACACHE_SECRET_NOKEY_K",))
    assert proc.returncode == 1
    assert proc.stdout.decode() == "dataset.datacache.io/half created\ncacheruntime.datacache.io/half created\n"
    assert proc.stderr.decode() == (
        "error: dataset.datacache.io/half: stored, but failed: dataset 'half': spec.mounts[0].encryptOptions[0]: "
        "secret 'nokey' key 'k' not found: set the environment variable DATACACHE_SECRET_NOKEY_K or write the "
        f"value to {datacache_home}/secrets/nokey/k\n"
        f"hint: fix {path} and apply again, or remove what it stored: datacache delete -f {path}\n")
    datasets = dc("get", "datasets", home=datacache_home, check=True).stdout.decode().splitlines()
    assert datasets[1].split()[0] == "half" and datasets[1].split()[5] == "Failed"
    runtimes = dc("get", "runtimes", home=datacache_home, check=True).stdout.decode().splitlines()
    assert runtimes[1].split()[:3] == ["half", "1", "1"] and runtimes[1].split()[5] == "Ready"


# 3 ----------------------------------------------------------------------------------------------
def test_cron_seconds_are_last_and_the_next_run_is_shown(datacache_home, tmp_path):
    local_dataset(tmp_path, datacache_home, "cr", {"a.bin": b"x" * 10})
    quartz = {"apiVersion": "datacache.io/v1alpha1", "kind": "DataLoad", "metadata": {"name": "every"},
              "spec": {"dataset": {"name": "cr"}, "policy": "Cron", "schedule": "*/20 * * * * *"}}
    (tmp_path / "dl.yaml").write_text(json.dumps(quartz))
    proc = dc("apply", "-f", str(tmp_path / "dl.yaml"), home=datacache_home)
    assert proc.returncode == 1 and proc.stderr.decode() == (
        f"error: {tmp_path / 'dl.yaml'}: spec.schedule: '*/20 * * * * *': the 6th field is seconds (croniter's "
        "order: minute hour day-of-month month day-of-week second) and '*' there fires every second: write 0 "
        "for once a minute, */N for every N seconds, or drop it for a 5-field schedule\n")
    quartz["spec"]["schedule"] = "0 3 * * *"
    (tmp_path / "dl.yaml").write_text(json.dumps(quartz))
    dc("apply", "-f", str(tmp_path / "dl.yaml"), home=datacache_home, check=True)
    doc = yaml.safe_load(dc("describe", "dataload", "every", home=datacache_home, check=True).stdout)
    created = parse_iso(doc["metadata"]["creationTimestamp"])
    expected = iso(next_fire("0 3 * * *", created))
    assert doc["status"]["nextScheduleTime"] == expected and expected.endswith("T03:00:00Z")
    assert parse_iso(expected) - created <= 86400
    wide = dc("get", "dataloads", "-o", "wide", home=datacache_home, check=True).stdout.decode().splitlines()
    assert "NEXT SCHEDULE" in wide[0] and expected in wide[1].split()


# 4 ----------------------------------------------------------------------------------------------
def test_scale_to_zero_replicas_is_the_in_process_cache_and_says_so(datacache_home, tmp_path):
    data = os.urandom(200_000)
    local_dataset(tmp_path, datacache_home, "zero", {"a.bin": data})
    proc = dc("scale", "cacheruntime", "zero", "--replicas", "0", home=datacache_home, check=True)
    assert proc.stdout.decode() == ("cacheruntime.datacache.io/zero scaled (replicas 0: in-process cache: replicas 0 "
                                    "and 1 run no worker processes, each reading process caches)\n")
    table = dc("get", "runtimes", home=datacache_home, check=True).stdout.decode().splitlines()
    assert table[1].split()[:3] == ["zero", "0", "0"] and table[1].split()[5] == "Ready"
    plane = Embedded(str(datacache_home))
    client = plane.open_dataset("zero")
    assert client.open("a.bin").read() == data
    client.close()
    status = plane.refresh_status("CacheRuntime", "zero")
    assert (status["phase"], status["desiredWorkers"], status["readyWorkers"]) == ("Ready", 0, 0)
    assert status["conditions"][0]["reason"] == "InProcess" and status["conditions"][0]["status"] == "True"
    assert status["cacheCapacity"] == format_bytes(64 << 20)
    plane.scale("zero", 1)
    one = plane.refresh_status("CacheRuntime", "zero")
    plane.close()
    assert (one["phase"], one["desiredWorkers"], one["readyWorkers"], one["cacheCapacity"]) == \
        ("Ready", 1, 1, status["cacheCapacity"])


# 5 ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args", [("ls", "-l", "pipe/d"), ("cat", "pipe/big.bin")])
def test_a_closed_stdout_pipe_ends_a_command_quietly(datacache_home, tmp_path, args):
    files = {f"d/f{i:05d}": b"x" for i in range(4000)}  # ~100 KB of listing: more than a pipe holds
    files["big.bin"] = b"y" * (1 << 20)
    local_dataset(tmp_path, datacache_home, "pipe", files)
    proc = subprocess.Popen([sys.executable, "-m", "datacache", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "DATACACHE_HOME": str(datacache_home)})
    first = proc.stdout.read(10)
    proc.stdout.close()  # as `| head -c 10` does
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 0
    assert err == b"" and len(first) == 10


# 8 ----------------------------------------------------------------------------------------------
def test_warmup_of_a_missing_dataset_draws_no_bar(datacache_home):
    proc = dc("warmup", "photo", home=datacache_home, env={"TTY_COMPATIBLE": "1", "COLUMNS": "120"})
    assert proc.returncode == 1 and proc.stdout == b""
    assert proc.stderr.decode() == ("error: dataset default/photo not found: apply it first (datacache apply -f "
                                    "FILE); see 'datacache get datasets'\n")


def test_a_misspelt_dataset_name_is_answered_with_the_close_one(datacache_home, tmp_path):
    local_dataset(tmp_path, datacache_home, "photos", {"a.jpg": b"x" * 10})
    for verb in (["warmup", "photo"], ["ls", "phtos"], ["mount", "photo", str(tmp_path / "mnt")]):
        proc = dc(*verb, home=datacache_home)
        assert proc.returncode == 1 and proc.stderr.decode() == (
            f"error: dataset default/{verb[1]} not found: did you mean 'photos'? else apply it first "
            "(datacache apply -f FILE); see 'datacache get datasets'\n"), verb
    assert not (tmp_path / "mnt").exists() or not os.listdir(tmp_path / "mnt")


def test_warmup_bar_rate_is_ufs_bytes_per_second_in_mib():
    from rich.progress import Progress

    from datacache.cli.warmupbar import LoadRateColumn

    clock = [100.0]
    column = LoadRateColumn()
    with Progress(column, get_time=lambda: clock[0], disable=True) as bar:
        task = bar.add_task("warmup", total=10 << 20, loaded=0)
        clock[0] = 104.0
        bar.update(task, completed=10 << 20, loaded=10 << 20)  # 10 MiB from the UFS in 4 s
        assert column.render(bar.tasks[0]).plain == "2.50MiB/s"


# 9 ----------------------------------------------------------------------------------------------
def test_mount_and_unmount_errors_have_the_same_form_as_the_rest(datacache_home, tmp_path):
    proc = dc("mount", "nosuch", str(tmp_path), home=datacache_home)
    assert proc.returncode == 1 and proc.stderr.decode() == (
        "error: dataset default/nosuch not found: apply it first (datacache apply -f FILE); see 'datacache get "
        "datasets'\n")
    proc = dc("unmount", str(tmp_path), home=datacache_home)
    assert proc.returncode == 1 and proc.stderr.decode() == f"error: {tmp_path} is not mounted\n"
