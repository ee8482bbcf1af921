"""JuiceFSRuntime with the real JuiceFS client: SQLite metadata, data on moto's S3 over HTTP.

One volume holds ``/data/train/*``, ``/data/other/x`` and ``/outside/y``; the Dataset mounts
``juicefs:///data``. Through ``datacache`` itself (CLI in child processes, so every output is
captured): apply, warm ``/train`` up with progress, Dataset status against ``juicefs warmup
--check`` and the bytes written, every file read through ``datacache mount`` with checksums, the
juicefs client killed and the mount recovered, delete refusing while mounted and then leaving no
process, mount or cache directory. No secret (object-storage secret key, metadata password) may
appear in any output, status or log.
"""

from __future__ import annotations

import errno
import hashlib
import os
import signal
import subprocess
import sys
import uuid

import pytest
import yaml

from datacache import mountinfo
from datacache.api.quantity import format_bytes
from datacache.mountinfo import MountState
from jfs_support import fill_volume, format_volume, jfs_env, processes_naming, wait_for

MiB = 1 << 20


def _files() -> dict[str, bytes]:
    """Volume path -> bytes: a file over one JuiceFS block (4 MiB), small ones, one outside /data."""
    rnd = lambda n: os.urandom(n)  # noqa: E731
    return {"/data/train/big.bin": rnd(5 * MiB + 123), "/data/train/a.txt": rnd(1000),
            "/data/train/sub/b.bin": rnd(300_000), "/data/train/empty": b"",
            "/data/other/x.bin": rnd(2 * MiB), "/outside/y.bin": rnd(4096)}


@pytest.fixture
def volume(juicefs_binary, moto_server, s3_bucket, tmp_path, no_leftovers):
    """``(meta url, secret key, files)``: a formatted volume filled with :func:`_files`."""
    _, bucket = s3_bucket
    meta = f"sqlite3://{tmp_path}/meta.db"
    secret_key = f"jfs-secret-{uuid.uuid4().hex}"
    format_volume(juicefs_binary, meta, "vol", ["--storage", "s3", "--bucket", f"{moto_server.endpoint_url}/{bucket}",
                                                "--access-key", "testing", "--secret-key", secret_key])
    files = _files()
    fill_volume(juicefs_binary, meta, str(tmp_path / "fill"), files)
    return meta, secret_key, files


def _yaml(name: str, cache_dir: str) -> str:
    secret = lambda opt, key: {"name": opt, "valueFrom": {"secretKeyRef": {"name": "jfs", "key": key}}}  # noqa: E731
    docs = [
        {"apiVersion": "datacache.io/v1alpha1", "kind": "Dataset", "metadata": {"name": name},
         "spec": {"mounts": [{"name": "vol", "mountPoint": "juicefs:///data",
                              "encryptOptions": [secret("metaurl", "metaurl"), secret("access-key", "access-key"),
                                                 secret("secret-key", "secret-key")]}]}},
        {"apiVersion": "datacache.io/v1alpha1", "kind": "JuiceFSRuntime", "metadata": {"name": name},
         "spec": {"tieredstore": {"levels": [{"mediumtype": "MEM", "quota": "32Mi"},
                                             {"mediumtype": "SSD", "path": cache_dir, "quota": "1Gi"}]},
                  "fuse": {"options": {"attr-cache": "1"}}}},
    ]
    return yaml.safe_dump_all(docs)


class _Cli:
    """``python -m datacache`` under ``home``; every output kept in ``outputs``."""

    def __init__(self, home: str, env: dict[str, str]):
        self.home, self.env, self.outputs = home, {**os.environ, **env, "DATACACHE_HOME": home}, []

    def __call__(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, "-m", "datacache", *args], capture_output=True, text=True,
                              env=self.env, timeout=300)
        self.outputs += [proc.stdout, proc.stderr]
        if ok:
            assert proc.returncode == 0, f"datacache {' '.join(args)}: {proc.stderr}"
        return proc

    def status(self, kind: str, name: str) -> dict:
        return yaml.safe_load(self("describe", kind, name).stdout)["status"]


def _juicefs_check(binary: str, path: str) -> str:
    """``juicefs warmup --check PATH`` output (what the status must agree with)."""
    return subprocess.run([binary, "warmup", "--check", path], capture_output=True, text=True, env=jfs_env(),
                          check=True, timeout=120).stderr


def test_juicefs_runtime_end_to_end(volume, juicefs_binary, tmp_path, monkeypatch, nearly_full_tmpfs):
    from datacache.control.embedded import Embedded
    from datacache_runtimes import juicefs_engine
    from datacache_runtimes.juicefs_cli import parse_check

    meta, secret_key, files = volume
    # the cache on a device with 8 % free: JuiceFS caches there only with the node's reserve (0.01
    # in the suite) passed on as --free-space-ratio; its own default, 0.1, would cache nothing
    home, cache_dir, mnt = str(tmp_path / "home"), str(nearly_full_tmpfs / "jfs-cache"), str(tmp_path / "reader")
    dc = _Cli(home, {"DATACACHE_SECRET_JFS_METAURL": meta, "DATACACHE_SECRET_JFS_ACCESS_KEY": "testing",
                     "DATACACHE_SECRET_JFS_SECRET_KEY": secret_key})
    (tmp_path / "r.yaml").write_text(_yaml("jfs", cache_dir))
    assert dc("apply", "-f", str(tmp_path / "r.yaml")).stdout.splitlines() == [
        "juicefsruntime.datacache.io/jfs created", "dataset.datacache.io/jfs created"]
    in_data = {p[len("/data"):]: b for p, b in files.items() if p.startswith("/data/")}
    train = {p: b for p, b in in_data.items() if p.startswith("/train/")}

    # status before any warmup: figures from juicefs info, nothing cached (written with --cache-size 0)
    st = dc.status("dataset", "jfs")
    assert (st["phase"], st["fileNum"], st["ufsTotal"]) == ("Bound", len(in_data),
                                                             format_bytes(sum(map(len, in_data.values()))))
    assert (st["cacheStates"]["cachedPercentage"], st["cacheStates"]["cacheCapacity"]) == ("0.0%", "1.00GiB")

    # DataLoad of a sub-directory, with progress
    (tmp_path / "dl.yaml").write_text(yaml.safe_dump({
        "apiVersion": "datacache.io/v1alpha1", "kind": "DataLoad", "metadata": {"name": "warm-train"},
        "spec": {"dataset": {"name": "jfs"}, "target": [{"path": "/train"}]}}))
    dc("apply", "-f", str(tmp_path / "dl.yaml"))
    dl = dc.status("dataload", "warm-train")
    assert dl["phase"] == "Complete", dl
    assert [(t["path"], t["files"], t["bytes"], t["cachedBytes"]) for t in dl["targets"]] == [
        ("/train", len(train), sum(map(len, train.values())), sum(map(len, train.values())))]

    # the status agrees with juicefs warmup --check, run here through the runtime's own client
    own = os.path.join(home, "runtimes", "default", "jfs", "juicefs", "mnt")
    _, _, whole = parse_check(_juicefs_check(juicefs_binary, own))
    _, _, of_train = parse_check(_juicefs_check(juicefs_binary, os.path.join(own, "train")))
    st = dc.status("dataset", "jfs")
    assert of_train == "100.0%" and whole not in ("0.0%", "100.0%")
    assert st["cacheStates"]["cachedPercentage"] == whole
    rt = dc.status("juicefsruntime", "jfs")
    assert rt["phase"] == "Ready" and rt["cacheCapacity"] == "1.00GiB"
    # a status read in a shell without the secrets cannot count, and the dataset has not failed
    bare = subprocess.run([sys.executable, "-m", "datacache", "describe", "dataset", "jfs"], capture_output=True,
                          text=True, timeout=120, env={k: v for k, v in dc.env.items()
                                                       if not k.startswith("DATACACHE_SECRET_")})
    st = yaml.safe_load(bare.stdout)["status"]
    (cond,) = st["conditions"]
    assert (st["phase"], cond["reason"], st["cacheStates"]["cachedPercentage"]) == ("Bound", "RuntimeNotReady", "-")
    assert cond["message"].startswith("its figures need the dataset's secrets: ") and "not found" in cond["message"]
    assert dc.status("dataset", "jfs")["cacheStates"]["cachedPercentage"] == whole  # with them again
    assert sum(os.path.getsize(os.path.join(b, n)) for b, _, ns in os.walk(cache_dir) for n in ns) >= \
        sum(map(len, train.values()))  # the blocks are in the level's directory

    # progress: a warmup of everything in batches of one file reports after each
    monkeypatch.setattr(juicefs_engine, "BATCH_FILES", 1)
    for key, value in dc.env.items():
        if key.startswith("DATACACHE_"):
            monkeypatch.setenv(key, value)
    seen = []
    plane = Embedded(home)
    try:
        assert plane.load_manifest(plane.get("Dataset", "jfs")).file_num == len(in_data)  # no .config, .stats ...
        _, result = plane.warmup("jfs", ["/"], on_progress=lambda p: seen.append((p.files_done, p.bytes_done)))
    finally:
        plane.close()
    assert result.ok and len(seen) == len(in_data) and seen == sorted(seen)
    assert seen[-1] == (len(in_data), sum(map(len, in_data.values())))
    assert dc.status("dataset", "jfs")["cacheStates"]["cachedPercentage"] == "100.0%"

    # datacache mount: juicefs mount in the foreground, supervised
    log = open(tmp_path / "mount.out", "w")
    reader = subprocess.Popen([sys.executable, "-m", "datacache", "mount", "jfs", mnt], stdout=log,
                              stderr=subprocess.STDOUT, env=dc.env)
    try:
        wait_for(lambda: reader.poll() is not None or mountinfo.probe(mnt, 2.0) is MountState.LIVE, 90, "the mount")
        assert reader.poll() is None, (tmp_path / "mount.out").read_text()
        assert _read_all(mnt, in_data) == _sha(in_data)
        assert not os.path.exists(os.path.join(mnt, "outside"))  # only /data of the volume
        for change in (lambda: open(os.path.join(mnt, "new.txt"), "wb"),
                       lambda: os.unlink(os.path.join(mnt, "train", "a.txt"))):
            with pytest.raises(OSError) as err:  # read-only: a reader cannot change the volume
                change()
            assert err.value.errno == errno.EROFS
        assert _read_all(mnt, in_data) == _sha(in_data)

        # kill the juicefs client (its own watchdog too): a dead mount, re-mounted by the supervisor
        clients = [p for p in processes_naming(mnt) if _is_juicefs(p)]
        assert clients
        for pid in clients:
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: mountinfo.probe(mnt, 2.0) is MountState.LIVE and
                 not set(clients) & set(processes_naming(mnt)), 90, "the re-mount")
        assert reader.poll() is None
        try:
            assert _read_all(mnt, train) == _sha(train)
        except OSError as err:
            raise AssertionError(f"{err}; mount output: {(tmp_path / 'mount.out').read_text()}") from err

        refused = dc("delete", "dataset", "jfs", ok=False)
        assert refused.returncode == 1 and f"dataset default/jfs is mounted at {mnt}" in refused.stderr
        dc("unmount", mnt)
        assert reader.wait(30) == 0
        # the runtime's own client stopped: not ready is a state (Bound, no figures), not a failure
        plane = Embedded(home)
        juicefs_engine.stop_runtime(plane.get("JuiceFSRuntime", "jfs"), home)
        plane.close()
        st = dc.status("dataset", "jfs")
        assert (st["phase"], st["conditions"][0]["reason"], st["cacheStates"]["cached"]) == \
            ("Bound", "RuntimeNotReady", "-")
        assert "its JuiceFS client is not mounted" in st["conditions"][0]["message"]
    finally:
        if reader.poll() is None:
            reader.send_signal(signal.SIGTERM)
            reader.wait(30)
        log.close()
    assert dc("delete", "dataset", "jfs").returncode == 0
    assert dc("delete", "juicefsruntime", "jfs").stdout.strip() == "juicefsruntime.datacache.io/jfs deleted"
    assert processes_naming(str(tmp_path)) == [] and mountinfo.mounted_at(mnt) is None
    assert not os.path.exists(os.path.join(cache_dir, "default", "jfs"))  # cleanCachePolicy OnRuntimeDeleted

    shown = "".join(dc.outputs) + (tmp_path / "mount.out").read_text() + _text_under(home)
    assert secret_key not in shown


def test_metaurl_password_never_shown(juicefs_binary, tmp_path, no_leftovers):
    """A metadata URL with a password (Redis, nothing listening): apply fails, saying why, and the
    password is in no output, status or log; no client is left running."""
    password = f"pw-{uuid.uuid4().hex}"
    home = str(tmp_path / "home")
    # go-redis options (its own URL query) make JuiceFS give up at once: with its defaults it retries
    # a refused dial for ~70 s, past the 60 s mount timeout; the failure and its words are the same.
    fail_fast = "max_retries=-1&min_retry_backoff=1ms&max_retry_backoff=1ms&pool_size=1"
    dc = _Cli(home, {"DATACACHE_SECRET_JFS_METAURL": f"redis://:{password}@127.0.0.1:1/1?{fail_fast}"})
    text = _yaml("jfs", str(tmp_path / "c")).replace("juicefs:///data", "juicefs:///")
    docs = list(yaml.safe_load_all(text))
    docs[0]["spec"]["mounts"][0]["encryptOptions"] = docs[0]["spec"]["mounts"][0]["encryptOptions"][:1]
    (tmp_path / "r.yaml").write_text(yaml.safe_dump_all(docs))
    applied = dc("apply", "-f", str(tmp_path / "r.yaml"), ok=False)
    assert applied.returncode == 1
    assert "dataset.datacache.io/jfs: stored, but failed: juicefsruntime default/jfs: the FUSE command" in \
        applied.stderr and "check the Dataset's metaurl secret" in applied.stderr
    assert "connection refused" in applied.stderr  # JuiceFS's own words reach the user
    st = dc.status("dataset", "jfs")
    assert st["phase"] == "Failed"
    dc("delete", "dataset", "jfs")
    dc("delete", "juicefsruntime", "jfs")
    shown = "".join(dc.outputs) + _text_under(home)
    assert password not in shown
    assert processes_naming(str(tmp_path)) == []


def _is_juicefs(pid: int) -> bool:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")) == "juicefs"
    except OSError:
        return False


def _sha(files: dict[str, bytes]) -> dict[str, str]:
    return {p: hashlib.sha256(b).hexdigest() for p, b in files.items()}


def _read_all(root: str, files: dict[str, bytes]) -> dict[str, str]:
    out = {}
    for path in files:
        with open(os.path.join(root, path.lstrip("/")), "rb") as f:
            out[path] = hashlib.sha256(f.read()).hexdigest()
    return out


def _text_under(root: str) -> str:
    """Every file under ``root`` except the secrets store itself (logs, state, configs), as text."""
    texts = []
    for base, _dirs, names in os.walk(root):
        if os.path.join("run", "secrets") in base:
            continue
        for name in names:
            try:
                with open(os.path.join(base, name), "rb") as f:
                    texts.append(f.read().decode("utf-8", "replace"))
            except OSError:
                pass
    return "".join(texts)
