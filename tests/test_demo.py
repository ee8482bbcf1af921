"""The main job as a test: ``datacache demo`` end to end, as the README's first command runs it
(JPEGs, Parquet, a tar shard on moto's S3 server plus a local directory), at a fifth of its
default size (400 JPEGs, a 64 MiB shard: 146 MiB, not 490) to keep the suite short; every step,
check and table is the same."""

from __future__ import annotations

import os
import re
import subprocess
import sys


def test_demo_end_to_end(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "datacache", "demo", "--files", "400", "--shard-mib", "64"],
                          capture_output=True, timeout=900, env=env)
    out = proc.stdout.decode()
    assert proc.returncode == 0, out + proc.stderr.decode()
    assert re.search(r"410/410 files verified", out)
    # -o wide: ... FILES, CACHE HIT RATIO, LAST TRACE CACHED ('-': no run recorded)
    assert re.search(r"^demo\s+145\.\d\dMiB\s+145\.\d\dMiB\s+2\.00GiB\s+100\.0%\s+Bound\s+\S+\s+410\s+100\.0%\s+-$",
                     out, re.M)
    assert "demo OK: every byte verified" in out
    assert os.listdir(tmp_path) == []  # cleaned up after itself
