"""Memory benchmark: peak and idle RSS of the FUSE daemon and of ``datacache warmup``, next to the
budget the README states (issue 17 item 7).

Run from the repository root, as root (FUSE mounts)::

    python -m benchmarks.memory [--readers 64] [--file-mib 32] [--warmup-mib 1536]
                                [--source http|local] [--idle-s 5]

- **daemon**: ``--readers`` files of ``--file-mib`` MiB each, cold (nothing cached), read at once
  by as many ``dd bs=1M`` processes through a FUSE mount made by the real CLI (``python -m
  datacache_fuse mount --background``, read mode auto). The daemon's ``VmRSS`` is sampled every
  50 ms; ``start`` is its RSS once mounted, ``peak`` its ``VmHWM`` after the reads, ``idle`` its
  RSS ``--idle-s`` seconds after the last reader ended.
- **warmup**: ``datacache warmup`` (a child process, as a user runs it) of one ``--warmup-mib``
  file; ``peak`` is its ``VmHWM`` sampled until it exits, ``start`` the same command's peak for an
  empty target (imports, dataset open: what it holds before loading anything).

``--source http`` (the default) serves the files with nginx (``benchmarks.nginx``): reads go
through aiohttp as S3's do (moto reads a whole object for every ranged GET, so 64 large objects
would measure moto); ``local`` reads them from a directory. The limit printed is ``start + budget
(READAHEAD_BUDGET) + overhead (procmem.OVERHEAD)``, the README's statement; a row past it says so.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from benchmarks.common import format_table
from benchmarks.nginx import NginxServer
from datacache.api.loader import load_resources
from datacache.control.embedded import Embedded
from datacache.procmem import OVERHEAD, rss_mib
from datacache.stack.readpath import READAHEAD_BUDGET

DATASET = "memory"
MIB = 1 << 20


@dataclass
class Figures:
    """RSS in MiB of one process: at ``start``, ``peak`` and ``idle`` (None: not measured)."""

    what: str
    start: float
    peak: float
    idle: float | None = None

    @property
    def limit(self) -> float:
        """The README's bound: start + budget + overhead (MiB)."""
        return self.start + (READAHEAD_BUDGET + OVERHEAD) / MIB


def write_files(directory: str, count: int, size: int) -> list[str]:
    """``count`` files of ``size`` random bytes (rotations of one buffer) named ``f000.bin`` ...;
    returns their names."""
    os.makedirs(directory, exist_ok=True)
    blob = os.urandom(size)
    names = []
    for i in range(count):
        names.append(f"f{i:03d}.bin")
        with open(os.path.join(directory, names[-1]), "wb") as f:
            f.write(blob[i:] + blob[:i])
    return names


_YAML = """apiVersion: datacache.io/v1alpha1
kind: Dataset
metadata: {{name: {name}}}
spec:
  mounts: [{mount}]
---
apiVersion: datacache.io/v1alpha1
kind: CacheRuntime
metadata: {{name: {name}}}
spec:
  blockSize: 4Mi
  tieredstore:
    levels: [{{mediumtype: SSD, path: cache, quota: {quota}}}]
"""


def apply_dataset(home: str, mount: dict, quota: str = "8Gi") -> None:
    """Dataset + CacheRuntime ``memory`` (one SSD level of ``quota``, 4 MiB blocks) over ``mount``."""
    path = os.path.join(home, f"{DATASET}.yaml")
    with open(path, "w") as f:
        f.write(_YAML.format(name=DATASET, mount=json.dumps(mount), quota=quota))
    plane = Embedded(home)
    try:
        plane.apply(load_resources(path))
    finally:
        plane.close()


@contextlib.contextmanager
def source(kind: str, directory: str):
    """The mount (``{"name", "mountPoint"}``) of ``directory``: served by nginx (``http``) or as
    it is (``local``)."""
    if kind == "http":
        with NginxServer(directory) as web:
            yield {"name": "web", "mountPoint": web.url + "/"}
    else:
        yield {"name": "local", "mountPoint": directory}


class _Sampler:
    """Samples a process's RSS every ``interval`` seconds in a thread; ``peak`` in MiB."""

    def __init__(self, pid: int, interval: float = 0.05):
        self.pid, self.interval, self.peak = pid, interval, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                self.peak = max(self.peak, rss_mib(self.pid)[1])
            time.sleep(self.interval)

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def daemon_figures(home: str, mountpoint: str, names: list[str], idle_s: float) -> Figures:
    """Mount ``memory`` at ``mountpoint``, read every file of ``names`` at once (one ``dd`` each),
    and return the daemon's figures; the mount is removed and the daemon ended whatever happens."""
    r = subprocess.run([sys.executable, "-m", "datacache_fuse", "mount", DATASET, mountpoint, "--background",
                        "--home", home], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"mount failed: {r.stdout}{r.stderr}")
    pid = int(re.search(r"pid (\d+)", r.stdout).group(1))
    try:
        start = rss_mib(pid)[0]
        readers = [subprocess.Popen(["dd", f"if={os.path.join(mountpoint, n)}", "of=/dev/null", "bs=1M"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for n in names]
        failed = [n for n, p in zip(names, readers) if p.wait() != 0]
        if failed:
            raise RuntimeError(f"reads through the mount failed: {failed[:5]}")
        peak = rss_mib(pid)[1]
        time.sleep(idle_s)
        return Figures(f"FUSE daemon, {len(names)} readers", start, peak, rss_mib(pid)[0])
    finally:
        subprocess.run([sys.executable, "-m", "datacache_fuse", "unmount", mountpoint, "--home", home],
                       capture_output=True, timeout=60)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)


def warmup_peak(home: str, *paths: str) -> float:
    """Peak RSS (MiB) of ``datacache warmup memory PATHS`` run as a child process."""
    proc = subprocess.Popen([sys.executable, "-m", "datacache", "warmup", DATASET, *paths, "-q", "--home", home],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    with _Sampler(proc.pid) as sampler:
        _, err = proc.communicate(timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"datacache warmup failed ({proc.returncode}): {err}")
    return sampler.peak


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__.split("\n\n")[0])
    ap.add_argument("--readers", type=int, default=64, help="concurrent readers of the daemon (default 64)")
    ap.add_argument("--file-mib", type=int, default=32, help="size of each reader's file in MiB (default 32)")
    ap.add_argument("--warmup-mib", type=int, default=1536, help="size of the warmed-up file in MiB (default 1536)")
    ap.add_argument("--source", choices=("http", "local"), default="http", help="where the files come from")
    ap.add_argument("--idle-s", type=float, default=5.0, help="seconds idle before the idle RSS (default 5)")
    args = ap.parse_args(argv)
    base = tempfile.mkdtemp(prefix="datacache-memory-")
    rows: list[Figures] = []
    try:
        data = os.path.join(base, "data")
        names = write_files(os.path.join(data, "readers"), args.readers, args.file_mib * MIB)
        write_files(os.path.join(data, "warmup"), 1, args.warmup_mib * MIB)
        os.makedirs(os.path.join(data, "empty"))
        with source(args.source, data) as mount:
            home = os.path.join(base, "home")
            os.makedirs(home, mode=0o700)
            apply_dataset(home, mount)
            mp = os.path.join(base, "mnt")
            os.makedirs(mp)
            rows.append(daemon_figures(home, mp, [f"readers/{n}" for n in names], args.idle_s))
            start = warmup_peak(home, "empty")
            rows.append(Figures(f"datacache warmup, one {args.warmup_mib} MiB file", start,
                                warmup_peak(home, "warmup")))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    budget, overhead = READAHEAD_BUDGET // MIB, OVERHEAD // MIB
    print(f"source {args.source}; budget {budget} MiB, overhead {overhead} MiB (README: peak <= start + budget "
          "+ overhead)")
    print(format_table(["process", "start MiB", "peak MiB", "peak - start", "limit MiB", "idle MiB", "verdict"],
                       [[f.what, f"{f.start:.0f}", f"{f.peak:.0f}", f"{f.peak - f.start:.0f}", f"{f.limit:.0f}",
                         "-" if f.idle is None else f"{f.idle:.0f}",
                         "within" if f.peak <= f.limit else "PAST THE LIMIT"] for f in rows]))
    return 0 if all(f.peak <= f.limit for f in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
