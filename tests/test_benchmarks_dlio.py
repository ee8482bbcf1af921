"""``benchmarks.dlio``'s own arithmetic and arguments (a DLIO run needs its 2.6 GB venv: not in CI).

The scaled UNet3D compute time keeps H100's bytes per second of compute per emulated accelerator
(0.323 s per batch of 7 files of 146,600,628 bytes); bad arguments fail with one line naming the
option.
"""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import dlio  # noqa: E402


def test_compute_time_keeps_h100_bytes_per_second_of_compute():
    args = dlio.parse_args(["--record-mib", "8"])
    assert dlio.compute_time(args) == 0.0185  # 0.323 s x 8 MiB / 146.6 MB
    assert dlio.compute_time(dlio.parse_args(["--record-mib", "140"])) == pytest.approx(0.323, abs=0.01)
    assert dlio.compute_time(dlio.parse_args(["--computation-time", "0.05"])) == 0.05
    assert args.systems == ("local", "datacache", "juicefs", "rclone") and args.files == 56 and args.repeat == 3


@pytest.mark.parametrize("argv, message", [
    (["--systems", "datacache,local"], "--systems: datacache,local: known local,datacache,juicefs,rclone, the local copy first"),
    (["--systems", "local,nfs"], "--systems: local,nfs"),
    (["--files", "0"], "--files, --record-mib, --epochs, --read-threads and --repeat must be >= 1"),
    (["--repeat", "0"], "--files, --record-mib, --epochs, --read-threads and --repeat must be >= 1"),
])
def test_bad_arguments_name_the_option(argv, message, capsys):
    with pytest.raises(SystemExit):
        dlio.parse_args(argv)
    assert message in capsys.readouterr().err


def test_results_md_embeds_the_last_dlio_run(tmp_path):
    from benchmarks.__main__ import dlio_section

    assert dlio_section(str(tmp_path)) == []  # no DLIO run: no section
    (tmp_path / "DLIO.md").write_text("DLIO 56 files x 8 MiB, started 2026-01-02 03:04 UTC, load 0.1\n\n"
                                      "| system | AU |\n|---|---|\n| local | 91.0% |\n")
    os.utime(tmp_path / "DLIO.md", (0, 86400))  # a clone's mtime: not the run's date
    text = "\n".join(dlio_section(str(tmp_path)))
    assert "`python -m benchmarks.dlio --out " in text and ", started 2026-01-02 03:04 UTC), not this one" in text
    assert "1970" not in text
    assert "| local | 91.0% |" in text and "![DLIO chart](DLIO.png)" in text
