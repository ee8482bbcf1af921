"""Smoke test of ``benchmarks.native_floor`` at a tiny size (it measures nothing): the prototype C
server compiles and mounts, both mounts serve every byte of the tree (sha256 checked inside the
run), every pass has its three sides with positive rates, and nothing is left mounted or on disk."""

from __future__ import annotations

import os
import re
import shutil

import pytest

from datacache.mountinfo import mounts


@pytest.mark.skipif(shutil.which("gcc") is None or not os.path.exists("/dev/fuse") or os.geteuid() != 0,
                    reason="needs gcc (to compile the prototype), /dev/fuse and root")
def test_native_floor_tiny(tmp_path):
    from benchmarks import native_floor

    lines: list[str] = []
    native_floor.run(files=40, passes=1, threads=2, log=lines.append, parent=str(tmp_path))
    assert lines[0].startswith("40 files of 100,000 bytes"), lines
    kinds = [line.split()[0] for line in lines[1:]]
    assert kinds == ["hot", "dropped"], lines
    for line in lines[1:]:
        sides = re.findall(r"(direct|native C|datacache) ([\d,]+)/s ([\d.]+)x", line)
        assert [s[0] for s in sides] == ["direct", "native C", "datacache"], line
        assert all(int(rate.replace(",", "")) > 0 and float(ratio) > 0 for _, rate, ratio in sides), line
        assert sides[0][2] == "1.00"
    assert os.listdir(tmp_path) == []
    assert not [m for m in mounts() if m.mountpoint.startswith(str(tmp_path))]
