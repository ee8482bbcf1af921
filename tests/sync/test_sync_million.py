"""Case C12: a source of 1,000,000 files syncs in bounded memory and time, with progress, and
``datacache get datasets`` answers with the true fileNum and ufsTotal in bounded time.

The source is generated (``genfs``): listed in order for the first sync (apply), then directory by
directory in descending order, so that the second sync sorts 1M entries out of order (external
merge) and diffs them against the first. Both run in a child process that reports its own peak RSS
(VmHWM); before streaming, one such sync held 3.35 GB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import genfs

FILES, PER_DIR = 1_000_000, 1000
PEAK_RSS_BOUND = 350 << 20  # bytes; measured 270-288 MiB, ~100 MiB of them the imports (2026-12-06: 397-402
# before the manifest's mapped copy was hashed by pread, written a row group at a time and mapped by its writer)
HERE = os.path.dirname(os.path.abspath(__file__))


def expected_counts(files: int, extra: int, changed_mod: int, deleted_mod: int) -> tuple[int, int, int]:
    """(added, changed, deleted) when a source of ``files`` files gets ``extra`` more, a new version
    of every id 0 (mod changed_mod) and loses every id 1 (mod deleted_mod)."""
    after = files + extra
    added = sum(1 for i in range(files, after) if genfs.exists(i, after, deleted_mod))
    changed = sum(1 for i in range(files) if i % changed_mod == 0 and genfs.exists(i, after, deleted_mod))
    deleted = sum(1 for i in range(files) if not genfs.exists(i, after, deleted_mod))
    return added, changed, deleted


@pytest.mark.slow
def test_million_files_sync_in_bounded_memory_and_status_in_bounded_time(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "DATACACHE_HOME": str(home)}
    proc = subprocess.run([sys.executable, os.path.join(HERE, "million_child.py"), str(home), str(FILES),
                           str(PER_DIR)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"\nC12 figures: {json.dumps(got)}")

    assert got["file_num"] == FILES
    assert got["total_size"] == sum(genfs.size_of(i) for i in range(FILES))
    probe = [0, 1, FILES // 2, FILES - 1]
    assert got["probe"] == [[genfs.size_of(i), genfs.etag_of(i)] for i in probe]
    assert got["listdir_d0001"] == ["f0001000.bin", "f0001001.bin", PER_DIR]

    from million_child import CHANGES
    counts = expected_counts(FILES, CHANGES["extra"], CHANGES["changed_mod"], CHANGES["deleted_mod"])
    assert tuple(got["counts"]) == counts == (499, 20000, 1000)
    # 20,000 changed paths: the diff keeps the first 10,000 in memory, all of them on disk.
    assert got["truncated"] and got["changed_kept"] == 10000
    assert got["changed_head"] == ["d0000/f0000000.bin", "d0000/f0000050.bin"]
    assert got["deleted_all"] == 1000
    assert got["progress_last"] == FILES + 499 - 1000 and got["progress_calls"] > 100
    assert got["peak_rss"] < PEAK_RSS_BOUND, f"peak RSS {got['peak_rss'] >> 20} MiB"

    # `datacache get datasets` as a user runs it (a new process; the scheme registered first).
    code = (f"import sys; sys.path.insert(0, {HERE!r}); import genfs; genfs.register(); "
            "from datacache.cli import main; sys.argv = ['datacache', 'get', 'datasets', '-o', 'json']; main()")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    get_s = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    status = json.loads(proc.stdout)["items"][0]["status"]
    print(f"get datasets: {get_s:.1f} s")
    assert status["fileNum"] == FILES + 499 - 1000
    assert get_s < 60
