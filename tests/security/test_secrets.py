"""Secrets never leak: the demo-like flow (apply, get/describe in every format, warmup, ls, cat,
sync, a FUSE mount) with credentials set, plus failures that carry messages (an unreachable
endpoint, a UFS outage during a read, a missing secret). Every CLI output, every log record, every
exception text, and every byte written under DATACACHE_HOME is searched for the secret values."""

from __future__ import annotations

import logging
import os
import sys

import pytest
from click.testing import CliRunner

from datacache.cli import cli
from datacache.control.embedded import Embedded
from datacache.errors import UFSUnavailableError
from security_support import s3_mount

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "faults"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fuse"))
from faultproxy import FaultProxy  # noqa: E402
from fuse_support import HAVE_FUSE, cli as fuse_cli, force_cleanup  # noqa: E402

KEY = "AKIALEAKCHECK7Q3Z9XW"
SECRET = "sEcReT/leak+check=Zq8Wv3Nn0Pp1Rr2"
VALUES = [KEY.encode(), SECRET.encode()]


def _yaml(name: str, mount: dict) -> str:
    import json

    ds = {"apiVersion": "datacache.io/v1alpha1", "kind": "Dataset", "metadata": {"name": name},
          "spec": {"mounts": [mount]}}
    rt = {"apiVersion": "datacache.io/v1alpha1", "kind": "CacheRuntime", "metadata": {"name": name},
          "spec": {"blockSize": "256Ki", "tieredstore": {"levels": [
              {"mediumtype": "MEM", "quota": "16Mi"}, {"mediumtype": "SSD", "path": "cache", "quota": "256Mi"}]}}}
    return json.dumps(ds) + "\n---\n" + json.dumps(rt) + "\n"


def test_no_secret_in_outputs_logs_status_errors_or_files(datacache_home, monkeypatch, moto_server, s3_bucket,
                                                          tmp_path, caplog):
    monkeypatch.setenv("DATACACHE_SECRET_MOTO_KEY", KEY)
    monkeypatch.setenv("DATACACHE_SECRET_MOTO_SECRET", SECRET)
    fs, bucket = s3_bucket
    fs.pipe({f"{bucket}/train/{i}.bin": os.urandom(300_000 + i) for i in range(6)})
    caplog.set_level(logging.DEBUG, logger="datacache")
    caplog.set_level(logging.INFO)
    home = str(datacache_home)
    seen: list[bytes] = []
    runner = CliRunner()

    def run(*args: str, ok: bool = True) -> None:
        result = runner.invoke(cli, [*args, "--home", home] if args[0] not in ("demo",) else list(args))
        seen.append(result.stdout_bytes + result.stderr_bytes)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            seen.append(repr(result.exception).encode())
        if ok:
            assert result.exit_code == 0, result.output

    good = tmp_path / "good.yaml"
    good.write_text(_yaml("leak", s3_mount(moto_server, bucket)))
    dead = s3_mount(moto_server, bucket)
    dead["options"] = {"endpoint_url": "http://127.0.0.1:9", "connect_timeout": 1, "read_timeout": 1}
    bad = tmp_path / "bad.yaml"
    bad.write_text(_yaml("unreachable", dead))
    missing = s3_mount(moto_server, bucket)
    missing["encryptOptions"][0]["valueFrom"]["secretKeyRef"]["name"] = "absent"
    nosecret = tmp_path / "nosecret.yaml"
    nosecret.write_text(_yaml("nosecret", missing))

    run("apply", "-f", str(good))
    for fmt in ("table", "wide", "json", "yaml"):
        run("get", "datasets", "-o", fmt)
        run("get", "runtimes", "-o", fmt)
    run("describe", "dataset", "leak")
    run("warmup", "leak", "/train")
    run("get", "dataloads", "-o", "yaml")
    run("ls", "-l", "leak/train")
    run("cat", "leak/train/0.bin")
    run("sync", "leak")
    run("apply", "-f", str(bad), ok=False)
    run("get", "datasets", "-o", "json", ok=False)
    run("warmup", "unreachable", "/", ok=False)
    run("apply", "-f", str(nosecret), ok=False)
    run("warmup", "nosecret", "/", ok=False)
    run("describe", "dataset", "unreachable", ok=False)

    # A UFS outage during a read: the exception's text.
    with FaultProxy(moto_server.endpoint_url) as proxy:
        outage = s3_mount(moto_server, bucket)
        outage["options"] = {"endpoint_url": proxy.endpoint_url, "connect_timeout": 1, "read_timeout": 1}
        (tmp_path / "outage.yaml").write_text(_yaml("outage", outage))
        run("apply", "-f", str(tmp_path / "outage.yaml"))
        plane = Embedded(home)
        client = plane.open_dataset("outage")
        proxy.set_mode("500")
        with pytest.raises(UFSUnavailableError) as info:
            client.open("train/1.bin").read()
        seen.append(f"{info.value} {info.value!r} {info.value.strerror}".encode())
        client.close()
        plane.close()

    if HAVE_FUSE:
        mp = str(tmp_path / "mnt")
        os.makedirs(mp)
        try:
            r = fuse_cli("mount", "leak", mp, "--background", home=home)
            seen.append((r.stdout + r.stderr).encode())
            assert r.returncode == 0, r.stderr
            with open(os.path.join(mp, "train", "2.bin"), "rb") as f:
                assert len(f.read()) == 300_002
            r = fuse_cli("unmount", mp, home=home)
            seen.append((r.stdout + r.stderr).encode())
        finally:
            force_cleanup(home, mp)

    seen.extend(r.getMessage().encode() + repr(r.exc_info).encode() for r in caplog.records)
    for root, _, names in os.walk(home):  # state.db, manifests, logs, stats, block files
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                seen.append(f.read())
    leaks = [blob[:200] for blob in seen for value in VALUES if value in blob]
    assert not leaks, leaks
    assert len(seen) > 30
