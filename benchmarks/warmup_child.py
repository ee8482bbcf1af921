"""``python -m benchmarks.warmup_child HOME DATASET TARGET...``: one datacache warmup, measured.

Runs ``Embedded(HOME).warmup(DATASET, TARGETS)`` (what ``datacache warmup`` runs, with its
malloc settings, ``procmem.keep_blocks_malloc``, and ``procmem.freeze_gc``) in a process of its
own and prints one JSON line:
``seconds`` (wall, the warmup call only: interpreter start-up and imports are outside it, as a
copy's are), ``bytes``, ``files``, ``ok``, the first ``failures`` and ``vm_hwm_mib`` (this
process's peak RSS, ``VmHWM``: ``ru_maxrss`` would carry the parent's peak over
``fork``/``exec``). Exit status 0, or 1 when the warmup did not complete.
"""

from __future__ import annotations

import json
import sys
import time

from benchmarks.fuse_read import vm_hwm_mib


def main(argv: list[str]) -> int:
    import os

    import fsspec.implementations.http  # noqa: F401 - the UFS clients' imports, outside the timing as the copy's
    import obstore.store  # noqa: F401
    import s3fs  # noqa: F401

    from datacache import procmem
    from datacache.control.embedded import Embedded

    home, dataset, targets = argv[0], argv[1], argv[2:]
    procmem.keep_blocks_malloc()  # as `datacache warmup` does (datacache.cli.warmupbar)
    plane = Embedded(home)
    procmem.freeze_gc()
    try:
        t0 = time.perf_counter()
        _, result = plane.warmup(dataset, targets)
        seconds = time.perf_counter() - t0
    finally:
        plane.close()
    print(json.dumps({
        "seconds": seconds, "ok": bool(result.ok),
        "bytes": sum(t.bytes for t in result.targets), "files": sum(t.files for t in result.targets),
        "failures": [str(f) for t in result.targets for f in t.failures][:3],
        "vm_hwm_mib": vm_hwm_mib(os.getpid()),
    }))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
