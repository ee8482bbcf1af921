"""What a local source's listing leaves out or keeps, as a user meets it through the CLI: an empty
directory is found by a warmup (issue 18, item 5)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from support import dataset_yaml


def datacache(home, *args: str) -> subprocess.CompletedProcess:
    """``python -m datacache ARGS`` with ``home`` as DATACACHE_HOME, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "datacache", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DATACACHE_HOME": str(home)})


def apply(tmp_path, home, name: str, src) -> None:
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(dataset_yaml(name, [{"name": "local", "mountPoint": str(src)}],
                                 [{"mediumtype": "SSD", "path": "cache", "quota": "64Mi"}]))
    r = datacache(home, "apply", "-f", str(spec))
    assert r.returncode == 0, r.stderr


def test_warmup_of_an_empty_directory_completes_with_0_files(tmp_path, datacache_home):
    src = tmp_path / "src"
    (src / "train").mkdir(parents=True)
    (src / "valid").mkdir()  # as MLPerf Storage's DLIO leaves it
    (src / "train" / "a.bin").write_bytes(os.urandom(3000))
    apply(tmp_path, datacache_home, "dlio", src)
    r = datacache(datacache_home, "warmup", "-q", "dlio", "/valid")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert re.fullmatch(r"dataload\.datacache\.io/\S+: Complete in \d+\.\ds, 0B loaded from the UFS \(0B/s\)",
                        lines[0]), lines
    assert lines[1:] == ["  /valid: Complete: 0 files, 0B of 0B cached"]
    # A path that is really missing still fails, saying so.
    r = datacache(datacache_home, "warmup", "-q", "dlio", "/nothere")
    assert r.returncode == 1 and "no such file, directory or match in dataset 'dlio'" in r.stdout
