"""ThinRuntimeProfile and ThinRuntime as resources: located one-line errors, the packaged profiles
and example load, and the CLI lists them (profiles are cluster-scoped)."""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

import pytest

import datacache_runtimes
from datacache.api.loader import load_resources
from datacache.errors import ConfigError

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
HEADER = "apiVersion: datacache.io/v1alpha1\n"
RUNTIME = (HEADER + "kind: ThinRuntime\nmetadata: {name: d}\nspec:\n  profileName: p\n"
           "  tieredstore: {levels: [{mediumtype: MEM, quota: 1Gi}]}\n")


def errors_of(tmp_path, text: str) -> list[str]:
    path = tmp_path / "thin.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_resources(str(path))
    return str(caught.value).replace(str(tmp_path) + "/", "").splitlines()


def profile(spec: str) -> str:
    return HEADER + "kind: ThinRuntimeProfile\nmetadata: {name: p}\nspec:\n  fileSystemType: myfs\n" + spec


@pytest.mark.parametrize("spec, error", [
    ("  fuse: {command: 'sshfs -f host:/ /mnt'}\n",
     "thin.yaml: spec.fuse.command: 'sshfs -f host:/ /mnt' is a string: write the command as an argv list, one item "
     "per argument (e.g. ['sshfs', '-f', 'host:/', '/mnt']); it never runs through a shell"),
    ("  fuse: {command: []}\n", "thin.yaml: spec.fuse.command: must have at least 1 item"),
    ("  plugin: p\n  fuse: {command: [x]}\n",
     "thin.yaml: spec: set exactly one of plugin (an entry point in group 'datacache.runtimes') or fuse.command "
     "(a FUSE command as an argv list)"),
    ("", "thin.yaml: spec: set exactly one of plugin (an entry point in group 'datacache.runtimes') or "
     "fuse.command (a FUSE command as an argv list)"),
    ("  plugin: p\n  options: {password: x}\n",
     "thin.yaml: spec.options.password: 'password' is a credential: do not write it in plain text, put it in a "
     "Secret and reference it from encryptOptions (valueFrom.secretKeyRef)"),
    ("  fuse: {command: [x], mountTimeout: 0}\n", "thin.yaml: spec.fuse.mountTimeout: must be greater than 0, got 0"),
])
def test_profile_mistakes(tmp_path, spec, error):
    assert errors_of(tmp_path, profile(spec)) == [error]


def test_runtime_mistakes(tmp_path):
    assert errors_of(tmp_path, RUNTIME + "  replicas: 2\n") == ["thin.yaml: spec.replicas: must be at most 1, got 2"]
    assert errors_of(tmp_path, RUNTIME.replace("  profileName: p\n", "")) == [
        "thin.yaml: spec.profileName: missing required field"]


def test_profile_is_cluster_scoped_and_registers_its_scheme(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text(profile("  fuse: {command: [x]}\n").replace("{name: p}", "{name: p, namespace: team}")
                    + "---\n" + HEADER + "kind: Dataset\nmetadata: {name: d}\nspec:\n  mounts: [{name: a, mountPoint: 'myfs://c/v'}]\n")
    prof, ds = load_resources(str(path))
    assert prof.metadata.namespace == "default" and ds.spec.mounts[0].scheme == "myfs"


def test_packaged_profiles_and_example_load():
    profiles = sorted(glob.glob(os.path.join(os.path.dirname(datacache_runtimes.__file__), "profiles", "*.yaml")))
    assert [load_resources(p)[0].metadata.name for p in profiles] == ["sftp", "sshfs"]
    example = os.path.join(ROOT, "examples", "thin-sftp.yaml")
    with open(example, encoding="utf-8") as f:  # its ${...} placeholders filled, as a user does
        text = re.sub(r"\$\{[A-Z_]+\}", "/x", f.read().replace("${SFTP_PORT}", "22"))
    kinds = [r.kind for r in load_resources(example, text)]
    assert kinds == ["ThinRuntimeProfile", "ThinRuntime", "Dataset"]


def test_cli_lists_profiles_and_runtimes(tmp_path):
    env = {**os.environ, "DATACACHE_HOME": str(tmp_path / "home")}

    def dc(*args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "datacache", *args], capture_output=True, text=True, env=env,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    path = tmp_path / "rt.yaml"
    path.write_text(profile("  fuse: {command: [my-mount, '$(DATACACHE_THIN_CONFIG)']}\n") + "---\n" + RUNTIME)
    assert dc("apply", "-f", str(path)).splitlines() == ["thinruntimeprofile.datacache.io/p created",
                                                         "thinruntime.datacache.io/d created"]
    rows = [line.split() for line in dc("get", "thinruntimeprofiles", "-n", "elsewhere").splitlines()]
    assert rows[0] == ["NAME", "FILE", "SYSTEM", "TYPE", "PLUGIN", "FUSE", "COMMAND", "AGE"]
    assert rows[1][:3] == ["p", "myfs", "my-mount"]
    rows = [line.split() for line in dc("get", "thinruntimes").splitlines()]
    assert rows[0][:2] == ["NAME", "PROFILE"] and rows[1][:2] == ["d", "p"] and "NotReady" in rows[1]
    assert dc("delete", "thinruntimeprofile", "p") == "thinruntimeprofile.datacache.io/p deleted\n"
