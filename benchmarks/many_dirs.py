"""Large directories: warm shuffled epochs over a tree of ImageNet's shape, side by side.

Run from the repository root, as root (it mounts)::

    python -m benchmarks.many_dirs [--dirs 200] [--files 500] [--size 4096] [--sample 20000] [--repeat 5]
                                   [--scratch DIR]

ImageNet's training set is 1,000 directories of ~1,300 JPEGs. Work that grows with a directory's
size or with the tree's (a directory listing per read, a listing of the tree in every reading
process, a manifest decoded by every process) does not show in ``python -m benchmarks``, whose tree
is 20 directories of 75 files; here it does. Until 2026-12-06 datacache's read-ahead across files
listed the read file's directory once per read where its directory was not among the last 64
read: ~2.3 ms a read in ImageNet's shape.

Data: ``--dirs`` directories of ``--files`` files of ``--size`` random bytes, written in a scratch
directory (the local copy), the source of a Dataset with a local mount in a fresh home (one SSD
level holding everything, scan warmup on as by default), warmed with the ``datacache warmup``
engine. Systems: the local copy (``open`` + ``read``), ``datacache://`` (fsspec), the datacache FUSE
mount (``--read-mode no-open``), fsspec's ``simplecache`` over the local files (its cache filled by
the untimed pass). Workload: ``--sample`` files drawn once (the same for every system), read whole
and checked (xxh3) by 4 worker processes in shuffled order (:class:`benchmarks.loader.ReaderPool`,
a DataLoader's persistent workers): one untimed pass, then ``--repeat`` passes, the median kept.
Each system gets new worker processes, so a process's first open of a file (its manifest search,
its cache index query) falls in the timed passes as it does in a DataLoader's first epochs. The
page cache stays warm throughout. Ratios: / the local copy and / ``simplecache``; the largest
worker's peak RSS shows what each process holds of the manifest. ``--sample 100000`` (the whole
tree) has each worker open more files than a process keeps looked up (16,384) or remembers as
handed out (65,536), as a DataLoader worker over ImageNet's 1.28 million files does.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

from benchmarks.fuse_read import Mounts
from benchmarks.loader import Opener, ReaderPool, Task, file_checksum

DATASET = "imagenet-shape"
WORKERS = 4


def build(src: str, dirs: int, files: int, size: int, seed: int = 0) -> list[Task]:
    """Write ``dirs`` x ``files`` files of ``size`` random bytes under ``src``
    (``nDDDDDDDD/nDDDDDDDD_F.JPEG``, as ImageNet names them); returns one ``whole`` task per file."""
    rng = random.Random(seed)
    tasks = []
    for d in range(dirs):
        folder = f"n{d:08d}"
        os.makedirs(os.path.join(src, folder))
        for f in range(files):
            path = f"{folder}/{folder}_{f}.JPEG"
            data = rng.randbytes(size)
            with open(os.path.join(src, path), "wb") as out:
                out.write(data)
            tasks.append(Task("whole", path, file_checksum(data)))
    return tasks


def warmed_home(work: str, src: str, quota_bytes: int) -> str:
    """A fresh home with the Dataset over ``src`` applied (metadata synced) and every file warmed.
    Raises RuntimeError when the warmup does not complete."""
    from datacache.api.loader import load_resources
    from datacache.control.embedded import Embedded
    from datacache.warmup import warmup

    docs = [{"apiVersion": "datacache.io/v1alpha1", "kind": "Dataset", "metadata": {"name": DATASET},
             "spec": {"mounts": [{"name": "local", "mountPoint": f"local://{src}"}]}},
            {"apiVersion": "datacache.io/v1alpha1", "kind": "CacheRuntime", "metadata": {"name": DATASET},
             "spec": {"tieredstore": {"levels": [{"mediumtype": "SSD", "path": "cache", "quota": str(quota_bytes)}]}}}]
    path = os.path.join(work, "dataset.yaml")
    with open(path, "w") as f:
        f.write("\n---\n".join(json.dumps(d) for d in docs))
    home = os.path.join(work, "home")
    plane = Embedded(home)
    try:
        plane.apply(load_resources(path))
        client = plane.open_dataset(DATASET)
        try:
            result = warmup(client, [""])
        finally:
            client.close()
    finally:
        plane.close()
    if not result.ok:
        raise RuntimeError(f"warmup of {DATASET} did not complete: {result.phase}")
    return home


def epochs(opener: Opener, tasks: list[Task], repeat: int) -> tuple[float, list[float], float]:
    """``(median files/s, every pass's files/s, the largest worker's peak RSS in MiB)`` of
    ``repeat`` timed passes after an untimed one. Raises AssertionError when a read fails."""
    with ReaderPool(opener, WORKERS) as pool:
        rates, rss = [], 0.0
        for seed in range(repeat + 1):
            r = pool.run(tasks, seed=seed)
            if r.errors:
                raise AssertionError(f"{len(r.errors)} reads failed, the first: {r.errors[0]}")
            if seed:
                rates.append(r.items / r.seconds)
            rss = r.peak_rss_mib
    return statistics.median(rates), rates, rss


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.many_dirs", description=__doc__.split("\n")[0])
    ap.add_argument("--dirs", type=int, default=200, help="directories (default 200)")
    ap.add_argument("--files", type=int, default=500, help="files per directory (default 500)")
    ap.add_argument("--size", type=int, default=4096, help="bytes per file (default 4096)")
    ap.add_argument("--sample", type=int, default=20000, help="files read per pass (default 20000)")
    ap.add_argument("--repeat", type=int, default=5, help="timed passes per system (default 5)")
    ap.add_argument("--scratch", default=None, help="where the run's scratch directory goes (default: the temp dir)")
    args = ap.parse_args(argv)
    if min(args.dirs, args.files, args.size, args.sample, args.repeat) < 1:
        ap.error("--dirs, --files, --size, --sample and --repeat must be >= 1")
    work = tempfile.mkdtemp(prefix="datacache-many-dirs-", dir=args.scratch)
    mounts = Mounts()
    try:
        t0 = time.monotonic()
        src = os.path.join(work, "src")
        tasks = build(src, args.dirs, args.files, args.size)
        home = warmed_home(work, src, quota_bytes=2 * len(tasks) * max(args.size, 4096) + (256 << 20))
        print(f"==> {len(tasks):,} files in {args.dirs} directories of {args.files}, {args.size:,} bytes each; "
              f"built and warmed in {time.monotonic() - t0:.0f} s", flush=True)
        sample = random.Random(1).sample(tasks, min(args.sample, len(tasks)))
        mount = mounts.datacache("datacache FUSE mount", home, os.path.join(work, "mnt"), read_mode="no-open",
                                 dataset=DATASET)
        systems = [
            ("local copy", Opener("path", src)),
            ("datacache:// (fsspec)", Opener("fsspec", f"{DATASET}/", protocol="datacache", options={"home": home})),
            ("datacache FUSE mount", Opener("path", mount.mountpoint)),
            ("fsspec simplecache", Opener("fsspec", src + "/", protocol="simplecache",
                                          options={"target_protocol": "file",
                                                   "cache_storage": os.path.join(work, "simplecache")})),
        ]
        rows = []
        for name, opener in systems:
            median, rates, rss = epochs(opener, sample, args.repeat)
            rows.append((name, median, rss))
            print(f"    {name}: {median:,.0f} files/s (passes {', '.join(f'{r:,.0f}' for r in rates)}); "
                  f"reader peak RSS {rss:.0f} MiB", flush=True)
        local, peer = rows[0][1], rows[-1][1]
        print(f"\n{len(sample):,} of {len(tasks):,} files a pass, {WORKERS} worker processes, median of "
              f"{args.repeat} passes after an untimed one\n")
        print("| system | files/s | vs local | vs simplecache | reader peak RSS (MiB) |")
        print("|---|---|---|---|---|")
        for name, median, rss in rows:
            print(f"| {name} | {median:,.0f} | {median / local:.2f}x | {median / peer:.2f}x | {rss:.0f} |")
        return 0
    finally:
        for problem in mounts.cleanup():
            print(f"cleanup: {problem}", file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
