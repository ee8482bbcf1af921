"""A ThinRuntime over a real SFTP server through the ``sshfs`` FUSE-command profile.

The packaged profile (``profiles/sshfs.yaml``: ``datacache-sshfs $(DATACACHE_THIN_CONFIG)``) mounts
the served directory with Debian's sshfs; the mounted directory is the UFS. Both the state
directory and the served directory have spaces and shell metacharacters in their names: they must
work as literal paths and run nothing. Reads go through ``plane.open_dataset``, ``datacache://`` and
``datacache mount`` (the readers' FUSE mount over the thin runtime's).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

import datacache_runtimes
from datacache_runtimes.fusecmd import FuseCommand
from thin_support import (ODD, apply_yaml, change_is_seen_after_sync, make_tree, mounts_under, no_pwned,
                          processes_matching, read_all, read_url, sha, thin_yaml)

PROFILE = os.path.join(os.path.dirname(datacache_runtimes.__file__), "profiles", "sshfs.yaml")


@pytest.fixture
def sshfs_dataset(sshd, sshfs_available, odd_home, tmp_path, monkeypatch):
    """Dataset ``box`` over ``served <ODD>`` through the sshfs profile, the key given by environment."""
    root = str(tmp_path / f"served {ODD}")
    files = make_tree(root)
    known = tmp_path / "known_hosts"
    known.write_text(sshd.host_key_line())
    with open(sshd.key_path) as f:
        monkeypatch.setenv("DATACACHE_SECRET_SSH_ID", f.read())
    mount = {"name": "box", "mountPoint": sshd.url(root), "options": {"known_hosts": str(known)},
             "encryptOptions": [{"name": "key_filename", "valueFrom": {"secretKeyRef": {"name": "ssh", "key": "id"}}}]}
    with open(PROFILE) as f:
        plane, lines = apply_yaml(odd_home, f.read() + "---\n" + thin_yaml("box", "sshfs", mount))
    assert lines == ["thinruntimeprofile.datacache.io/sshfs created", "thinruntime.datacache.io/box created",
                     "dataset.datacache.io/box created"]
    return plane, files, root, FuseCommand(odd_home, "default", "box")


def test_sshfs_warmup_reads_literal_paths_and_stop(sshfs_dataset, odd_home, tmp_path):
    plane, files, root, fuse = sshfs_dataset
    assert mounts_under(fuse.target) == [os.path.realpath(fuse.target)]

    with open(fuse.config_path) as f:
        text = f.read()
    assert stat.S_IMODE(os.stat(fuse.config_path).st_mode) == 0o600
    config = json.loads(text)
    key_file = config["mounts"][0]["secretFiles"]["key_filename"]
    assert key_file == os.path.join(odd_home, "run", "secrets", "ssh", "id")
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    assert os.environ["DATACACHE_SECRET_SSH_ID"].splitlines()[1] not in text  # a path, never the value
    assert config["targetPath"] == fuse.target and config["mounts"][0]["mountPoint"].endswith(ODD)

    _, result = plane.warmup("box", [])
    assert result.ok, [t.failures for t in result.targets]
    assert read_all(plane, "box", files) == sha(files)
    assert read_url(odd_home, "box/a/b/deep.bin") == sha(files)["a/b/deep.bin"]
    (ds,) = plane.list("Dataset")
    assert ds["status"]["cacheStates"]["cachedPercentage"] == "100.0%"
    (rt,) = plane.list("ThinRuntime")
    assert rt["status"]["phase"] == "Ready"

    with open(os.path.join(fuse.dir, "fuse.json")) as f:
        pid = json.load(f)["pid"]
    assert plane.delete("ThinRuntime", "box") == "thinruntime.datacache.io/box deleted"
    assert mounts_under(fuse.target) == []
    assert not os.path.exists(f"/proc/{pid}") and processes_matching(fuse.target) == []
    assert no_pwned(str(tmp_path), os.getcwd()) == []


def test_sshfs_file_changed_over_sftp_is_seen_after_sync(sshd, sshfs_dataset):
    plane, files, root, _ = sshfs_dataset
    change_is_seen_after_sync(sshd, plane, "box", root, files)


def test_sshfs_killed_is_restarted_on_next_open(sshfs_dataset):
    plane, files, _, fuse = sshfs_dataset
    with open(os.path.join(fuse.dir, "fuse.json")) as f:
        pid = json.load(f)["pid"]
    os.killpg(pid, signal.SIGKILL)  # the whole command dies; its mount stays, dead (ENOTCONN)
    deadline = time.monotonic() + 5
    while fuse.running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not fuse.running()

    assert read_all(plane, "box", files) == sha(files)  # opening the dataset mounted it afresh
    with open(os.path.join(fuse.dir, "fuse.json")) as f:
        assert json.load(f)["pid"] != pid
    assert fuse.running() and len(mounts_under(fuse.target)) == 1
    plane.delete("Dataset", "box")  # its runtime's command goes with it
    assert not fuse.running() and mounts_under(fuse.target) == []


def test_datacache_mount_reads_a_thin_dataset(sshfs_dataset, odd_home, tmp_path):
    plane, files, _, _ = sshfs_dataset
    assert plane.warmup("box", [])[1].ok
    mnt = str(tmp_path / "reader mnt")
    os.makedirs(mnt)
    env = {**os.environ, "DATACACHE_HOME": odd_home}
    run = [sys.executable, "-m", "datacache"]
    subprocess.run([*run, "mount", "box", mnt, "--background", "--timeout", "30"], env=env, check=True, timeout=60)
    try:
        seen = {rel: hashlib.sha256(open(os.path.join(mnt, rel), "rb").read()).hexdigest() for rel in files}
    finally:
        subprocess.run([*run, "unmount", mnt], env=env, timeout=60)
    assert seen == sha(files)
