"""Several nodes (issue 17 item 5): a large file of a runtime with 3 cache workers, read through a
``--read-mode passthrough`` mount, first through the workers, then passed through from this node's
file tier, side by side with the local copy, ratios printed.

Run from the repository root, as root (it mounts and drops the page cache)::

    python -m benchmarks.cluster_passthrough [--size-mib 256] [--repeat 3] [--dir /var/tmp]

Set-up (one temporary directory on ``--dir``, removed at the end): a file of ``--size-mib`` MiB of
random bytes in a local directory (the UFS, and the *local copy* side); a Dataset over it and a
CacheRuntime with ``replicas: 3`` (three worker processes started by the embedded supervisor,
blocks of 4 MiB placed over them by rendezvous hashing), one SSD level and ``fileTier.quota`` of
1.5x the file; ``datacache warmup`` (every block in a worker's cache); ``datacache mount
--read-mode passthrough --background``.

Rows (page cache dropped before each, ``sync; echo 3 > /proc/sys/vm/drop_caches``; every read is
``readinto()`` of a 1 MiB buffer, sha256 checked):

- **first open, through the workers**: the version is complete in the cache but not in the file
  tier, so the OPEN is answered without passthrough and every byte comes through READ from the
  workers' blocks (on one node the client reads a worker's cache file directly, checksum
  verified: the workers' short-circuit path, no HTTP). This open also starts the copy into the file
  tier in the background (one copy at a time), which competes with the read;
- **later open, passthrough from the file tier** (after the copy is complete): the kernel reads the
  file tier's copy, the daemon sees no READ (median of ``--repeat``, min-max);
- **local copy**: the source file (median of ``--repeat``; alternating with the row above).

For each row, the daemon's CPU seconds and its ``read`` syscalls (``syscr`` of
``/proc/PID/io``: one per FUSE request it takes from /dev/fuse, plus its reads of cache files) during
the read; at the end the daemon's own request counts over the session (its log line at exit), and
the space each copy takes (allocated bytes of the workers' cache directories and of the file tier).

Figures are from a machine shared with other work (two CPUs): expect noise, see the spread.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import sys
import tempfile
import time

from benchmarks.common import MB, format_table, spread, summarize, timed
from benchmarks.fuse_read import Mounts, drop_caches, read_paths
from datacache.api.loader import load_resource_dict
from datacache.control import supervisor
from datacache.control.embedded import Embedded
from datacache.stack import layout

MiB = 1 << 20
NAME = "spread"
WORKERS = 3


def write_source(path: str, size: int) -> str:
    """``size`` random bytes written to ``path`` in 4 MiB writes; returns their sha256."""
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for offset in range(0, size, 4 * MiB):
            data = os.urandom(min(4 * MiB, size - offset))
            digest.update(data)
            f.write(data)
    return digest.hexdigest()


def allocated(root: str) -> int:
    """Bytes allocated to the regular files under ``root`` (holes not counted)."""
    total = 0
    for base, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(base, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def read_syscalls(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        return int(dict(line.split(": ") for line in f.read().splitlines())["syscr"])


def measured(read, pid: int, samples: list, syscalls: list) -> None:
    """Drop the page cache, then time ``read()`` with the daemon ``pid``'s CPU and read syscalls."""
    drop_caches()
    before = read_syscalls(pid)
    samples.append(timed(read, pid))
    syscalls.append(read_syscalls(pid) - before)


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=256, help="size of the file (MiB, default 256)")
    parser.add_argument("--repeat", type=int, default=3, help="timed passes of the passthrough and local rows")
    parser.add_argument("--dir", default="/var/tmp", help="where the temporary directories go")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("run as root: it mounts and writes /proc/sys/vm/drop_caches")
    size = args.size_mib * MiB
    top = tempfile.mkdtemp(prefix="datacache-spread-", dir=args.dir)
    home, src, mnt = (os.path.join(top, d) for d in ("home", "src", "mnt"))
    for d in (home, src):
        os.makedirs(d, mode=0o700)
    source = os.path.join(src, "large.bin")
    want = write_source(source, size)
    plane = Embedded(home)
    mounts = Mounts()
    try:
        docs = [{"apiVersion": "datacache.io/v1alpha1", "kind": "Dataset", "metadata": {"name": NAME},
                 "spec": {"mounts": [{"name": "local", "mountPoint": src}]}},
                {"apiVersion": "datacache.io/v1alpha1", "kind": "CacheRuntime", "metadata": {"name": NAME},
                 "spec": {"replicas": WORKERS, "blockSize": "4Mi", "tieredstore": {
                     "levels": [{"mediumtype": "SSD", "path": "cache", "quota": f"{2 * args.size_mib}Mi"}],
                     "fileTier": {"quota": f"{args.size_mib * 3 // 2}Mi"}}}}]
        print("\n".join(plane.apply([load_resource_dict(d, "benchmark") for d in docs])))
        _, result = plane.warmup(NAME, [])
        if not result.ok:
            raise RuntimeError(f"warmup failed: {[t.failures for t in result.targets]}")
        mount = mounts.datacache("passthrough mount", home, mnt, "passthrough", dataset=NAME)
        path = os.path.join(mnt, "large.bin")
        runtime = plane.get("CacheRuntime", NAME)
        tier_dir = layout.file_tier(home, runtime)[0]

        def read_mount():
            return read_paths([path], MiB, [want])

        def read_local():
            return read_paths([source], MiB, [want])

        first, first_calls = [], []
        measured(read_mount, mount.pid, first, first_calls)
        wait_for(lambda: any(re.fullmatch(r"[0-9a-f]{32}", n) for n in os.listdir(tier_dir)), 300,
                 "the file tier's copy")
        passes = {"passthrough": ([], []), "local": ([], [])}
        for n in range(args.repeat):
            for side in (("passthrough", "local") if n % 2 == 0 else ("local", "passthrough")):
                measured(read_mount if side == "passthrough" else read_local, mount.pid, *passes[side])
        local = summarize(passes["local"][0])

        def row(label: str, samples: list, calls: list) -> list[str]:
            s = summarize(samples)
            return [label, f"{s.mb_s:.0f} ({spread(samples)})", f"{s.mb_s / local.mb_s:.2f}x",
                    f"{s.server_cpu:.2f}" if s.server_cpu is not None else "?", str(sorted(calls)[(len(calls) - 1) // 2])]

        table = [row("first open, through the 3 workers (READ)", first, first_calls),
                 row("later open, passthrough from the file tier", *passes["passthrough"]),
                 row("local copy", *passes["local"])]
        worker_bytes = sum(allocated(layout.level_dir(home, runtime, lv))
                           for lv in runtime.spec.tieredstore.ordered_levels if lv.mediumtype != "MEM")
        tier_bytes = allocated(tier_dir)
        mounts.unmount(mount)
        with open(mount.log, encoding="utf-8", errors="replace") as f:
            ended = [line.strip() for line in f if "opens passed through" in line]
        print(f"\nfile of {args.size_mib} MiB, {WORKERS} workers, blocks of 4 MiB, page cache dropped before each "
              f"read; median of {args.repeat} (min-max MB/s), first open once\n")
        print(format_table(["read", "MB/s", "vs local", "daemon CPU s", "daemon read syscalls"], table,
                           right=(1, 2, 3, 4)))
        print(f"\nspace: workers' block caches {worker_bytes / MB:.0f} MB, file tier {tier_bytes / MB:.0f} MB "
              f"(quota {runtime.spec.tieredstore.file_tier.quota})")
        print("daemon at exit: " + (ended[-1].split(": ", 1)[-1] if ended else "(no exit line in its log)"))
        return 0
    finally:
        for problem in mounts.cleanup():
            print(f"cleanup: {problem}", file=sys.stderr)
        supervisor.stop(home, "default", NAME)
        plane.close()
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
