"""The FUSE-command lifecycle when things go wrong: a command that cannot start, exits early or
never mounts fails with a ResourceError naming the profile and what to fix, within its timeout, and
leaves no process, mount or state behind; arguments are passed literally and run nothing."""

from __future__ import annotations

import json
import os
import sys
import time
import uuid

import pytest

from datacache.errors import ResourceError
from datacache_runtimes.fusecmd import FuseCommand
from thin_support import ODD, apply_yaml, mounts_under, no_pwned, processes_matching, thin_yaml


def profile_yaml(command: list[str], timeout: float = 5) -> str:
    return json.dumps({"apiVersion": "datacache.io/v1alpha1", "kind": "ThinRuntimeProfile",
                       "metadata": {"name": "broken"},
                       "spec": {"fileSystemType": "brokenfs", "fuse": {"command": command, "mountTimeout": timeout}}})


def apply_broken(home: str, command: list[str], timeout: float = 5) -> tuple[str, float]:
    """Apply profile ``broken`` + dataset ``vol`` (its own scheme); returns the error and seconds taken."""
    mount = {"name": "v", "mountPoint": "brokenfs://cluster/vol"}
    text = profile_yaml(command, timeout) + "\n---\n" + thin_yaml("vol", "broken", mount)
    started = time.monotonic()
    with pytest.raises(ResourceError) as caught:
        apply_yaml(home, text)
    return str(caught.value), time.monotonic() - started


def assert_nothing_left(home: str) -> None:
    fuse = FuseCommand(home, "default", "vol")
    assert mounts_under(home) == []
    assert not os.path.exists(os.path.join(fuse.dir, "fuse.json"))
    assert processes_matching(fuse.config_path) == []


def test_missing_executable(thin_home):
    message, took = apply_broken(thin_home, ["/nonexistent/mount-helper", "$(DATACACHE_THIN_CONFIG)"])
    assert message.startswith("dataset.datacache.io/vol: stored, but failed: thinruntime default/vol "
                              "(thinruntimeprofile 'broken'): spec.fuse.command ")
    assert "cannot be started: No such file or directory" in message and "installed executable" in message
    assert took < 2
    assert_nothing_left(thin_home)


def test_command_not_on_path(thin_home):
    message, _ = apply_broken(thin_home, ["no-such-mount-helper-7f3"])
    assert "spec.fuse.command[0] 'no-such-mount-helper-7f3' was not found" in message
    assert_nothing_left(thin_home)


def test_command_exiting_before_mounting(thin_home):
    exits = "import sys; print('cannot reach vol'); sys.exit(3)"
    message, took = apply_broken(thin_home, [sys.executable, "-c", exits])
    assert "exited with status 3 before mounting" in message and "its output: cannot reach vol" in message
    assert "fix spec.fuse.command" in message and took < 5
    assert_nothing_left(thin_home)


def test_mount_never_appearing_times_out_and_kills_everything(thin_home):
    marker = f"never-mounts-{uuid.uuid4().hex}"
    child = ("import subprocess, sys, time; "
             f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', '{marker}']); time.sleep(60)")
    message, took = apply_broken(thin_home, [sys.executable, "-c", child, marker], timeout=1)
    assert "did not mount" in message and "within 1 s (spec.fuse.mountTimeout)" in message
    assert 1 <= took < 4
    assert processes_matching(marker) == []  # the command and the child it started
    assert_nothing_left(thin_home)


def test_arguments_and_paths_are_literal(odd_home, tmp_path, monkeypatch):
    monkeypatch.setenv("DATACACHE_SECRET_ANY_KEY", "s3cr3t-value")
    recorder = tmp_path / "record.py"
    recorder.write_text("import json, os, sys\n"
                        "json.dump({'argv': sys.argv[1:], 'env': dict(os.environ)}, open('argv.json', 'w'))\n"
                        "sys.exit(1)\n")
    args = ["$(DATACACHE_THIN_TARGET)", "$(DATACACHE_THIN_CONFIG)", "; touch PWNED", "$(touch PWNED)",
            "`touch PWNED`", "a b | touch PWNED", "$(DATACACHE_THIN_TARGET)/x y"]
    message, _ = apply_broken(odd_home, [sys.executable, str(recorder), *args])
    assert "exited with status 1" in message
    fuse = FuseCommand(odd_home, "default", "vol")
    with open(os.path.join(fuse.dir, "argv.json")) as f:
        seen = json.load(f)
    assert ODD in fuse.target
    assert seen["argv"] == [fuse.target, fuse.config_path, "; touch PWNED", "$(touch PWNED)", "`touch PWNED`",
                            "a b | touch PWNED", fuse.target + "/x y"]
    assert seen["env"]["DATACACHE_THIN_CONFIG"] == fuse.config_path
    assert not [k for k in seen["env"] if k.startswith("DATACACHE_SECRET_")]
    assert no_pwned(str(tmp_path), os.getcwd()) == []
    assert_nothing_left(odd_home)


def test_missing_profile_is_named(thin_home):
    text = thin_yaml("vol", "nope", {"name": "v", "mountPoint": "/srv/data"})
    expected = r"thinruntime default/vol: spec.profileName: thinruntimeprofile 'nope' not found: apply it first"
    with pytest.raises(ResourceError, match=expected):
        apply_yaml(thin_home, text)
