"""``python -m benchmarks.copy_child < JOB``: one plain local copy, measured, in a process of its own.

Reads a copy job (JSON, see ``benchmarks.systems.LocalCopy.copy_job``) on stdin, runs
``benchmarks.systems.copy_files`` on it and prints one JSON line: ``seconds`` (wall, the copy
only: interpreter start-up and the clients' imports are outside it, as for
``benchmarks.warmup_child``), ``bytes`` and ``vm_hwm_mib`` (this process's peak RSS). A fresh
process, as a downloader run from the shell is: it pays the first touches of the memory its GETs
use, as ``datacache warmup`` does. Exit status 0; a failed copy raises (status 1, traceback on
stderr for the benchmark's log).
"""

from __future__ import annotations

import json
import os
import sys
import time

from benchmarks.fuse_read import vm_hwm_mib


def main() -> int:
    import fsspec.implementations.http  # noqa: F401 - the clients' imports, outside the timing
    import s3fs  # noqa: F401

    from benchmarks.systems import copy_files

    job = json.load(sys.stdin)
    t0 = time.perf_counter()
    nbytes = copy_files(job)
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "bytes": nbytes, "vm_hwm_mib": vm_hwm_mib(os.getpid())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
