"""What a compiled FUSE server would give on small files: the floor of issue 17's small-file goals.

``python -m benchmarks.native_floor [--files N] [--passes K]`` (root, /dev/fuse, gcc): a tree of
``N`` files of 100 KB (default 10,000, the issue's size) in a local directory; datacache serves it
through its own mount (``--read-mode no-open``, every file warmed into the SSD tier first) and
:file:`native_floor.c`, a prototype of ~100 lines of C (compiled here, never part of the product),
serves the same directory through a FUSE mount that answers only what a no-open read-only mount
needs. 4 reader processes (:class:`benchmarks.loads.ProcessReaders`, buffered ``open()``) then
read every file on each side: page cache hot, and after ``drop_caches``. Each line prints
files/s, the ratio to the direct read, and each daemon's CPU seconds (user + system) for the pass.

Why it exists: each buffered ``open()`` of Python < 3.14 asks ``isatty()``, an ``ioctl(TCGETS)``
that the kernel forwards to any FUSE server (fs/fuse/ioctl.c); a page-cache-hot file then costs
one round trip, whatever answers it. If a compiled server's ratio stays under the goal, no
daemon can reach it on this kernel; if it reaches a goal that datacache misses, the cap is
Python's per-request cost.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks.common import cpu_seconds
from benchmarks.fuse_read import Mounts, drop_caches, start_fuse, verify_parallel
from benchmarks.loads import ProcessReaders

FILE_BYTES = 100_000
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native_floor.c")


def make_tree(root: str, files: int) -> tuple[list[str], list[str]]:
    """``files`` random files of ``FILE_BYTES`` under ``root`` (100 a directory); returns their
    relative paths and sha256 hex digests, in the same order."""
    rels, sums = [], []
    for i in range(files):
        rel = f"c{i % max(1, files // 100):03d}/f{i:06d}.jpg"
        os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
        data = os.urandom(FILE_BYTES)
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
        rels.append(rel)
        sums.append(hashlib.sha256(data).hexdigest())
    return rels, sums


def prepare_datacache(home: str, tree: str) -> None:
    """Apply a Dataset ``small`` over ``tree`` in DATACACHE_HOME ``home`` and warm it whole."""
    spec = os.path.join(home, "small.yaml")
    os.makedirs(home, exist_ok=True)
    with open(spec, "w") as f:
        f.write(f"apiVersion: datacache.io/v1alpha1\nkind: Dataset\nmetadata: {{name: small}}\n"
                f"spec:\n  mounts: [{{name: local, mountPoint: {tree}}}]\n---\n"
                "apiVersion: datacache.io/v1alpha1\nkind: CacheRuntime\nmetadata: {name: small}\n"
                "spec:\n  tieredstore:\n    levels: [{mediumtype: SSD, path: cache/ssd, quota: 4Gi}]\n")
    env = {**os.environ, "DATACACHE_HOME": home}
    for args in (["apply", "-f", spec], ["warmup", "small", "/"]):
        subprocess.run([sys.executable, "-m", "datacache", *args], env=env, check=True, capture_output=True)


def run(files: int, passes: int, threads: int, log=print, parent: str | None = None) -> None:
    """Build, mount, check every byte on both mounts (AssertionError on a mismatch), then time
    ``passes`` hot and ``passes`` dropped passes of every side (see the module doc); ``log`` gets
    one line per pass. Everything lives in a temporary directory (under ``parent`` if given),
    unmounted and removed at the end."""
    if shutil.which("gcc") is None:
        raise SystemExit("native_floor: gcc is needed to compile the prototype (apt-get install gcc)")
    work = tempfile.mkdtemp(prefix="datacache-native-floor-", dir=parent)
    tree, home, exe = (os.path.join(work, d) for d in ("tree", "home", "native_floor"))
    mounts = Mounts()
    try:
        rels, sums = make_tree(tree, files)
        prepare_datacache(home, tree)
        dc = mounts.datacache("datacache", home, os.path.join(work, "mnt-datacache"), "no-open", dataset="small")
        subprocess.run(["gcc", "-O2", "-pthread", "-o", exe, SOURCE], check=True)
        mnt_c = os.path.join(work, "mnt-native")
        os.makedirs(mnt_c)
        native = start_fuse(mounts, "native", "native C", [exe, mnt_c, tree, str(threads)], mnt_c,
                            os.path.join(work, "native.log"))
        sides = [("direct", tree, None), ("native C", mnt_c, native.pid), ("datacache", dc.mountpoint, dc.pid)]
        for _, base, _ in sides[1:]:
            verify_parallel([os.path.join(base, r) for r in rels], sums, 1 << 20)
        log(f"{files:,} files of {FILE_BYTES:,} bytes, 4 reader processes, buffered open(); "
            f"native C server with {threads} threads, datacache no-open")
        with ProcessReaders(4) as readers:
            for kind in ["hot"] * passes + ["dropped"] * passes:
                cells, direct = [], None
                for name, base, pid in sides:
                    paths = [os.path.join(base, r) for r in rels]
                    if kind == "dropped":
                        drop_caches()
                    else:
                        readers.read(paths)
                    c0 = cpu_seconds(pid) if pid else 0.0
                    t0 = time.perf_counter()
                    _, n = readers.read(paths)
                    rate = n / (time.perf_counter() - t0)
                    cpu = cpu_seconds(pid) - c0 if pid else 0.0
                    direct = direct or rate
                    cells.append(f"{name} {rate:,.0f}/s {rate / direct:.2f}x" + (f" (daemon {cpu:.2f} s CPU)" if pid else ""))
                log(f"{kind:8s}" + " | ".join(cells))
    finally:
        mounts.cleanup()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.native_floor", description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=10_000, help="100 KB files (default 10,000)")
    ap.add_argument("--passes", type=int, default=3, help="timed passes of each kind (default 3)")
    ap.add_argument("--threads", type=int, default=2, help="request threads of the C server (default 2)")
    a = ap.parse_args(argv)
    run(a.files, a.passes, a.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
