"""Child process of ``test_sync_million``: apply a Dataset over a generated source of FILES files,
change the source, sync again, and print one JSON line of figures, including this process's peak
RSS (VmHWM, bytes), so the parent measures the sync alone and not itself.

Usage: python million_child.py HOME FILES PER_DIR
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import genfs  # noqa: E402

genfs.register()

from datacache.api.loader import load_resources  # noqa: E402
from datacache.control.embedded import Embedded  # noqa: E402

CHANGES = {"changed_mod": 50, "deleted_mod": 1000, "extra": 500}


def peak_rss() -> int:
    """VmHWM of this process in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def main(home: str, files: int, per_dir: int) -> dict:
    ds = {"apiVersion": "datacache.io/v1alpha1", "kind": "Dataset", "metadata": {"name": "gen"},
          "spec": {"mounts": [{"name": "g", "mountPoint": "gensrc://data",
                               "options": {"files": files, "per_dir": per_dir}}]}}
    rt = {"apiVersion": "datacache.io/v1alpha1", "kind": "CacheRuntime", "metadata": {"name": "gen"},
          "spec": {"tieredstore": {"levels": [{"mediumtype": "SSD", "path": "cache", "quota": "1Gi"}]}}}
    path = os.path.join(home, "gen.yaml")
    with open(path, "w") as f:
        f.write(json.dumps(ds) + "\n---\n" + json.dumps(rt))
    out: dict = {}
    start = time.monotonic()
    plane = Embedded(home)
    plane.apply(load_resources(path))
    out["apply_s"] = time.monotonic() - start

    manifest = plane.load_manifest(plane.get("Dataset", "gen"))
    out["file_num"], out["total_size"] = manifest.file_num, manifest.total_size
    probe = [0, 1, files // 2, files - 1]
    out["probe"] = [[e.size, e.version] for e in (manifest.lookup(genfs.dataset_path(i, per_dir)) for i in probe)]
    out["listdir_d0001"] = sorted(manifest.listdir("d0001"))[:2] + [len(manifest.listdir("d0001"))]
    del manifest

    # Listed in order first (one run, no merge), now out of order: 1M entries through the merge sort.
    os.environ["GENSRC_OVERRIDE"] = json.dumps({"files": files + CHANGES["extra"], "reverse": True,
                                                "changed_mod": CHANGES["changed_mod"],
                                                "deleted_mod": CHANGES["deleted_mod"]})
    progress: list[int] = []
    start = time.monotonic()
    diff = plane.sync("gen", on_progress=progress.append)
    out["sync_s"] = time.monotonic() - start
    out["counts"], out["truncated"] = list(diff.counts), diff.truncated
    out["changed_head"], out["changed_kept"] = diff.changed[:2], len(diff.changed)
    out["deleted_all"] = sum(1 for _ in diff.paths("deleted"))
    out["progress_last"], out["progress_calls"] = progress[-1], len(progress)
    out["peak_rss"] = peak_rss()
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))
