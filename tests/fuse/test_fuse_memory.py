"""The FUSE daemon's memory under many readers of cold files (issue 17 item 7).

The README states: a daemon's RSS peaks within its start + the read-ahead budget
(``READAHEAD_BUDGET``) + ``procmem.OVERHEAD``, and goes back near its start when idle. This runs the
measurement of ``benchmarks.memory`` at a smaller size: 64 ``dd`` readers at once, each of its own
cold 16 MiB file served by nginx (reads through aiohttp, as S3's), through a mount made by the real
CLI. Before the daemon fixed glibc's mmap threshold and trimmed after bursts it peaked ~400 MiB
over its start and kept it when idle.
"""

from __future__ import annotations

import os
import sys

import pytest

from datacache.procmem import OVERHEAD
from datacache.stack.readpath import READAHEAD_BUDGET

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.memory import MIB, apply_dataset, daemon_figures, source, write_files  # noqa: E402
from benchmarks.nginx import nginx_program  # noqa: E402

pytestmark = pytest.mark.skipif(nginx_program() is None, reason="needs nginx (Debian: nginx)")

READERS = 64
IDLE_SLACK_MIB = 64  # what an idle daemon may keep past its start: connection pools, index pages


def test_daemon_rss_within_budget_with_64_readers(fuse_available, tmp_path):
    data = str(tmp_path / "data")
    names = write_files(data, READERS, 16 * MIB)
    home, mp = str(tmp_path / "home"), str(tmp_path / "mnt")
    os.makedirs(home, mode=0o700)
    os.makedirs(mp)
    with source("http", data) as mount:
        apply_dataset(home, mount)
        fig = daemon_figures(home, mp, names, idle_s=3.0)
    limit = (READAHEAD_BUDGET + OVERHEAD) / MIB
    print(f"daemon RSS: start {fig.start:.0f}, peak {fig.peak:.0f}, idle {fig.idle:.0f} MiB (limit +{limit:.0f})")
    assert fig.peak - fig.start <= limit, (
        f"daemon peaked {fig.peak - fig.start:.0f} MiB over its start ({fig.start:.0f} MiB), past budget + "
        f"overhead {limit:.0f} MiB")
    assert fig.idle - fig.start <= IDLE_SLACK_MIB, (
        f"idle daemon kept {fig.idle - fig.start:.0f} MiB over its start (peak {fig.peak:.0f} MiB)")
