"""Smoke test of ``benchmarks.many_dirs`` at a tiny size (it measures nothing): the tree is built
and warmed, every system reads the sample with every byte checked (inside the run), the table has
the four systems with positive rates and the local copy as the 1.00x reference, and nothing is
left mounted or on disk."""

from __future__ import annotations

import os
import re

import pytest

from datacache.mountinfo import mounts


@pytest.mark.skipif(not os.path.exists("/dev/fuse") or os.geteuid() != 0, reason="needs /dev/fuse and root (it mounts)")
def test_many_dirs_tiny(tmp_path, capsys):
    from benchmarks import many_dirs

    assert many_dirs.main(["--dirs", "3", "--files", "20", "--size", "1000", "--sample", "50", "--repeat", "1",
                           "--scratch", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("==> 60 files in 3 directories of 20, 1,000 bytes each"), out
    rows = re.findall(r"^\| ([^|]+) \| ([\d,]+) \| ([\d.]+)x \| ([\d.]+)x \| (\d+) \|$", out, re.M)
    assert [r[0] for r in rows] == ["local copy", "datacache:// (fsspec)", "datacache FUSE mount", "fsspec simplecache"]
    assert all(int(r[1].replace(",", "")) > 0 and int(r[4]) > 0 for r in rows), rows
    assert rows[0][2] == "1.00" and rows[-1][3] == "1.00"
    assert os.listdir(tmp_path) == []
    assert not [m for m in mounts() if m.mountpoint.startswith(str(tmp_path))]
