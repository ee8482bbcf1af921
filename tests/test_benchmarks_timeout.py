"""Smoke test of ``python -m benchmarks --system-timeout``, at tiny sizes (it measures nothing): a
system past its time limit is reported as timed out, not counted, and leaves no mount, daemon or
child process behind; the run goes on with the next system."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from test_benchmarks_smoke import TINY  # noqa: E402


def _children() -> set[int]:
    """Pids of this process's children, but multiprocessing's resource tracker (one per process,
    for its lifetime: started by the first reader pool of the session, not by one run)."""
    kids = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and b"resource_tracker" not in cmdline:
            kids.add(int(pid))
    return kids


def _processes_naming(path: str) -> list[str]:
    """Command lines of live processes that name ``path`` (mount daemons, warmup processes)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if path in cmdline:
            found.append(f"{pid}: {cmdline}")
    return found


@pytest.mark.skipif(not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
                    reason="needs /dev/fuse and fusermount3 (the datacache FUSE mount)")
def test_peer_benchmark_system_past_its_time_limit_is_reported_and_cleaned_up(tmp_path):
    """A source slow enough (700 ms to the first byte of every GET, one reader) that no cache's
    cold epoch of 24 files (>= 17 s) fits in a 7 s limit, while each step of the local copy does: the
    datacache FUSE mount and then fsspec's simplecache are each "timed out after 7 s in <step>" (the run goes
    on to the next system), their figures are not counted, datacache's goals are NOT met, and no
    mount, daemon or child process of theirs is left."""
    import re

    from benchmarks.__main__ import parse_args, run
    from benchmarks.report import ratios
    from datacache.mountinfo import mounts

    before = _children()
    argv = [*TINY, "--repeat", "1", "--latency-ms", "700", "--system-timeout", "7", "--sources", "s3",
            "--systems", "local,datacache-fuse,simplecache", "--out", str(tmp_path)]
    report = run(parse_args(argv), lambda s: None)

    statuses = {o.system: o.status for o in report.outcomes}
    assert statuses["local copy (the limit)"] == "ok"
    step = r"(set-up|JPEG tree, cold epoch)"  # the cold epoch, unless a loaded machine was slower to mount
    for name in ("datacache FUSE mount", "fsspec simplecache::s3"):
        assert re.fullmatch(rf"timed out after 7 s in {step}", statuses[name]), statuses
        o = next(o for o in report.outcomes if o.system == name)
        assert 7.0 <= o.seconds < 7.0 + 30.0, o  # the limit, then the clean-up
    fuse = next(o for o in report.outcomes if o.system == "datacache FUSE mount")
    if fuse.status.endswith("cold epoch"):  # it was mounted: the abort read its daemon's peak RSS, then ended it
        assert fuse.daemon_rss_mib is not None and fuse.daemon_rss_mib > 10, fuse
    assert {r.system for r in ratios(report.outcomes)} == {"local copy (the limit)"}  # not counted
    assert re.search(rf"\| s3 \| JPEG tree, warm epoch \| datacache FUSE mount \| timed out after 7 s in {step} "
                     r"\|  \|  \| NOT met \(no figure\) \|", report.text)
    assert f"Goals met: 0/{report.goals}." in report.text and report.goals == 5  # the mount's 5 workloads
    assert "- time limit: 7 s per step of a system" in report.text

    assert not [m for m in mounts() if m.mountpoint.startswith(report.work + os.sep)]
    with open("/proc/self/mounts") as f:
        assert report.work not in f.read()
    assert not _processes_naming(report.work)  # no FUSE daemon, warmup or reader process of the run
    assert _children() <= before  # the readers, moto and the proxy are reaped
    assert not os.path.exists(report.work)
