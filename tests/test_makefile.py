"""``make demo`` on a fresh clone (issue 19.2): it ran 15 minutes with minutes of silence. Each
long step must say what it does before it starts; ``make -n`` (commands printed, none run) shows
the order without installing anything."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.join(os.path.dirname(__file__), os.pardir)
# step -> how many lines before it its announcement may be (apt-get runs inside make system's script)
LONG_STEPS = {"-m venv": 2, "-m pip install": 2, "bin/datacache demo": 2,
              "apt-get install": 10}


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_every_long_step_of_make_demo_is_announced_first(tmp_path):
    out = subprocess.run(["make", "-n", "demo", f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    lines = out.splitlines()
    seen = []
    for i, line in enumerate(lines):
        step = next((s for s in LONG_STEPS if s in line and not line.lstrip().startswith("echo")), None)
        if step is None:
            continue
        seen.append(step)
        before = [ln for ln in lines[max(0, i - LONG_STEPS[step]):i] if ln.lstrip().startswith("echo \"==> ")]
        assert before, f"{step!r} starts with nothing said before it:\n{out}"
    assert sorted(set(seen)) == sorted(LONG_STEPS), seen


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_demo_installs_only_what_the_demo_needs(tmp_path):
    """Issue 17: ``make demo`` under 5 minutes on a fresh machine. The test suite's packages (torch,
    nginx, rclone, ...) took most of it; the demo installs fuse3, gcc (the FUSE loop's C part) and the
    demo extras only."""
    out = subprocess.run(["make", "-n", "demo", f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    installs = [ln for ln in out.splitlines() if "-m pip install" in ln and not ln.lstrip().startswith("echo")]
    assert len(installs) == 1 and "'.[demo]'" in installs[0] and "torch" not in installs[0], installs
    assert "for p in fuse3 gcc libc6-dev; do" in out and "nginx" not in out, out
