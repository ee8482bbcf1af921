"""FUSE read benchmark: the FUSE issue's speed goals, side by side in one run, ratios printed.

Run from the repository root, as root (it drops the page cache and mounts)::

    python -m benchmarks.fuse_read [--quick] [--repeat 3] [--profile]

Data (built in one temporary directory, removed at the end; ``benchmarks.common.DemoEnvironment``
gives the moto S3 server, the demo Dataset's YAML and ``DATACACHE_HOME``):

- a large file of random bytes (full: 1 GiB, ``--quick``: 128 MiB) in the Dataset's local mount
  (``local/bench/large.bin``, written in 4 MiB writes). It sits in the local mount rather than in
  the bucket because moto re-reads a whole object for every ranged GET, so warming a large object
  from it costs minutes; where the blocks came from does not matter to these rows, which read
  blocks held in the SSD cache;
- N files of 100,000 bytes each ("JPEG-sized"; full: 10,000, ``--quick``: 2,000) of random bytes, in
  folders of 100, written locally once (the *direct* side reads these) and uploaded to the moto
  bucket (``s3://demo-bucket/bench/jpeg/``; dataset path ``s3/bench/jpeg/``).

Systems:

- **direct**: ``open()`` + ``readinto()`` of the local files (the large file itself, and the local
  originals of the small files);
- **datacache mount**: ``datacache mount demo DIR --background`` over a home whose CacheRuntime
  is SSD-only (one SSD level with room for everything), after ``datacache warmup`` of every target
  (every block in the SSD cache). The dataset holds both kinds of files, so each workload gets the
  read mode a dataset of its kind gets from ``--read-mode auto``: the large-file rows a
  ``--read-mode passthrough`` mount, the small-file rows ``--read-mode no-open`` mounts of that home
  and of a second home with a MEM + SSD runtime over the *same* SSD directory (its SSD level's
  ``path`` points at the first home's); the small-file rows also read the SSD home through a
  third no-open mount with ``-o io_uring`` (FUSE over io_uring: the fuse module's ``enable_uring``
  is turned on for its INIT and back after; the row is left out, with a note, where it cannot be);
- **rclone mount --vfs-cache-mode full** (Debian's rclone) of the same bucket prefix on the same
  moto server, run with ``env -u AWS_CA_BUNDLE``, an S3 remote (provider Other, dummy keys) with
  ``--s3-endpoint``, ``--read-only`` and ``--dir-cache-time 1h``; its vfs cache is warmed by one full
  pass. (With the default 5 minutes, a full run outlives rclone's directory cache and a "warm" pass
  re-lists and HEADs every object again: rclone keeps each file's mtime in S3 metadata.)

The large-file rows read with ``open(path, "rb", buffering=0)`` then ``readinto()`` of one buffer
of ``--chunk-kib`` KiB (default 1 MiB) until EOF, or with the loaders of :mod:`benchmarks.loads`;
the small-file rows with 4 reader processes, each opening its share with buffered ``open()`` and
``read()`` (a DataLoader's workers).

Workloads and goals (issue 17; median of ``--repeat`` timed passes; rounds are interleaved, each
starting with the next system, so that drift in the machine's state hits every system alike):

1. **large file, page cache dropped** (``sync; echo 3 > /proc/sys/vm/drop_caches`` before each
   side): mount vs direct, goal >= 0.95x;
2. **large file, epoch 2**: the same file read again right after (page cache warm): >= 0.9x;
3. **numpy.memmap copy**, **safetensors load_file** (a file half the large file's size) and **fio
   randread --bs=128k** (up to 256 MiB read), each with the page cache dropped: >= 0.9x; the
   passthrough daemon's CPU seconds over all these passes are printed (near zero: no READ reaches it);
4. **small files, warm** (every system read them once before; the kernel's page cache and, for
   the mounts, the kernel's entry cache are warm): files/s through each mount vs direct, goal >=
   0.8x direct and >= 2x rclone (second and later passes of rclone: its vfs cache is warm); and,
   without a goal, the same with ``open(path, "rb", buffering=0)``, which skips ``isatty()``: a
   buffered ``open()`` costs a FUSE mount one IOCTL round trip per file on Python < 3.14
   (:class:`benchmarks.loads.ProcessReaders`);
5. **small files, page cache dropped** (``--cold-rounds`` passes, default 1, after all the warm
   rounds): every file reaches the mount's daemon (datacache: a block from the SSD cache - the
   first such pass is the MEM + SSD daemon's second access of each block, which promotes it to
   MEM, so its later passes are served from MEM; rclone: its vfs cache file); goal >= 0.7x direct.
   This is the regime of a dataset larger than RAM.

Before the timed rounds every system reads everything once, checking each file's sha256 against
the generator's. During each timed pass the CPU time of the serving process (datacache daemon,
rclone) and of moto is taken: a warm pass that made moto work is flagged. The daemon's peak RSS
is its ``VmHWM`` (``/proc/<pid>/status``) read just before it is unmounted; its pid is the one
``datacache mount`` prints (checked against the state file under ``$DATACACHE_HOME/run/fuse/``).

With ``--profile``, for each datacache workload that missed its goal, ``py-spy record`` samples the
daemon (all threads) for a few more passes and prints the top functions by own time and the
datacache / diskcache functions by total time, idle waits left out (``pip install py-spy`` into
the venv first). A worker thread waiting for the next request shows as ``Session._worker``'s own
time and is counted as idle.

Every mount (datacache and rclone) is removed with ``fusermount3 -uz`` and every process this
benchmark started is stopped in ``finally``, also on failure or Ctrl-C.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import yaml

from benchmarks.common import DATASET, MB, DemoEnvironment, cpu_seconds, format_table, peak_rss_mib
from benchmarks.loads import ProcessReaders, fio_randread, memmap_copy, safetensors_load, write_safetensors
from datacache.api.loader import load_resources
from datacache.control.embedded import Embedded

KB = 1000
MiB = 1 << 20
GiB = 1 << 30
SMALL_FILE_BYTES = 100 * KB
FILES_PER_DIR = 100
LARGE_WRITE = 4 * MiB  # write size used to make the large file
JPEG_PREFIX = "bench/jpeg"  # key prefix in the bucket; dataset path s3/bench/jpeg
LARGE_REL = "bench/large.bin"  # path inside the local mount; dataset path local/bench/large.bin
MODEL_REL = "bench/model.safetensors"  # half the large file's size, next to it
READERS = 4  # reader processes of the small-file rows
DROP_CACHES = "/proc/sys/vm/drop_caches"


# -- helpers -------------------------------------------------------------------------------------

def drop_caches() -> None:
    """``sync; echo 3 > /proc/sys/vm/drop_caches``: clean page cache, dentries and inodes go."""
    os.sync()
    with open(DROP_CACHES, "w") as f:
        f.write("3\n")


def read_paths(paths: list[str], chunk: int, sums: list[str] | None = None) -> tuple[int, int]:
    """Read every file with ``readinto`` of one ``chunk``-byte buffer until EOF; returns
    ``(bytes, files)``. With ``sums`` (one sha256 per path) every file is checked."""
    buf = bytearray(chunk)
    view = memoryview(buf)
    total = 0
    for i, p in enumerate(paths):
        h = hashlib.sha256() if sums is not None else None
        with open(p, "rb", buffering=0) as f:
            while True:
                n = f.readinto(buf)
                if not n:
                    break
                total += n
                if h is not None:
                    h.update(view[:n])
        if h is not None and h.hexdigest() != sums[i]:
            raise AssertionError(f"{p}: sha256 mismatch (read {total} bytes so far)")
    return total, len(paths)


def verify_parallel(paths: list[str], sums: list[str], chunk: int, threads: int = 8) -> float:
    """The untimed first pass: read and check every file with ``threads`` threads (it fills
    rclone's vfs cache from S3, so it is made parallel to keep the run short). Returns seconds."""
    t0 = time.perf_counter()
    n = max(1, math.ceil(len(paths) / (threads * 8)))
    parts = [(paths[i:i + n], sums[i:i + n]) for i in range(0, len(paths), n)]
    with ThreadPoolExecutor(threads) as pool:
        for fut in [pool.submit(read_paths, p, chunk, s) for p, s in parts]:
            fut.result()
    return time.perf_counter() - t0


def remove_tree_parallel(root: str, keep_top: bool = False, threads: int = 16) -> None:
    """Remove everything under ``root`` with ``threads`` threads unlinking files. On a filesystem
    mounted with ``discard`` (this machine's ext4) every unlink waits for its discard, about 3 ms:
    ``shutil.rmtree`` of the ~30,000 files of a full run takes minutes, 16 threads a few seconds.
    Never follows symlinks; errors are ignored (what is left is removed by the caller's rmtree)."""
    files, dirs = [], []  # dirs deepest first: os.walk bottom-up yields a folder after its children
    for top, dnames, fnames in os.walk(root, topdown=False):
        files += [os.path.join(top, n) for n in fnames]
        for n in dnames:
            path = os.path.join(top, n)
            (files if os.path.islink(path) else dirs).append(path)
    if not keep_top:
        dirs.append(root)

    def unlink(path: str) -> None:
        try:
            os.unlink(path)
        except OSError:
            pass

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(unlink, files, chunksize=64))
    for d in dirs:
        try:
            os.rmdir(d)
        except OSError:
            pass


def rotated(items: list, k: int) -> list:
    """``items`` starting at index ``k`` (mod len): round k of an interleaved comparison starts with
    another system, so that none always runs right after the same neighbour (rclone, say, whose
    Go runtime keeps a core busy for a moment after its pass)."""
    k %= len(items)
    return items[k:] + items[:k]


def vm_hwm_mib(pid: int) -> float | None:
    """Peak resident set size (``VmHWM``) of ``pid`` in MiB, or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def tree_hwm_mib(pid: int) -> float | None:
    """Peak RSS (``VmHWM``, MiB) of ``pid`` plus that of each of its live children (``/proc/PID/
    task/*/children``): a FUSE daemon that runs as a supervisor and a mount process (JuiceFS in the
    foreground) counts both. None when ``pid`` cannot be read."""
    own = vm_hwm_mib(pid)
    if own is None:
        return None
    children: set[int] = set()
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children.update(int(c) for c in f.read().split())
    except OSError:
        pass
    return own + sum(vm_hwm_mib(c) or 0.0 for c in children)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def is_fuse_mount(path: str) -> bool:
    from datacache.mountinfo import mounted_at

    top = mounted_at(path)
    return top is not None and top.is_fuse


def fmt_quantity(n: int) -> str:
    return f"{n // GiB}Gi" if n % GiB == 0 else f"{math.ceil(n / MiB)}Mi"


# -- mounts --------------------------------------------------------------------------------------

@dataclass
class Mount:
    """One mounted system: ``kind`` datacache | rclone | s3fs | juicefs, its mount point and serving
    ``pid``; ``group``: the process group ``pid`` leads is ended with it (a daemon's children)."""

    kind: str
    label: str
    mountpoint: str
    pid: int
    home: str = ""
    proc: subprocess.Popen | None = None  # rclone: our child
    peak_rss_mib: float | None = None
    log: str = ""
    group: bool = False


@dataclass
class Mounts:
    """Every mount and process this run started, so that ``cleanup`` can remove them all."""

    mounts: list[Mount] = field(default_factory=list)

    def datacache(self, label: str, home: str, mountpoint: str, read_mode: str = "auto",
                  dataset: str = DATASET, options: tuple[str, ...] = ()) -> Mount:
        """``datacache mount DATASET MOUNTPOINT --background --read-mode READ_MODE [-o OPTION]...``,
        recorded for :meth:`cleanup`. Raises RuntimeError when it fails."""
        from datacache_fuse.daemon import read_state

        os.makedirs(mountpoint, exist_ok=True)
        cmd = [sys.executable, "-m", "datacache", "mount", dataset, mountpoint, "--background", "--home", home,
               "--read-mode", read_mode, *(arg for o in options for arg in ("-o", o))]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL,
                           check=False)
        m = re.search(r"daemon pid (\d+)", r.stdout)
        if m:  # remember it before checking anything else, so that cleanup finds it
            self.mounts.append(Mount("datacache", label, mountpoint, int(m.group(1)), home=home))
        if r.returncode != 0 or not m:
            raise RuntimeError(f"datacache mount failed ({r.returncode}): {r.stdout}{r.stderr}")
        mount = self.mounts[-1]
        state = read_state(home, mountpoint)
        if state is None or state["pid"] != mount.pid:
            raise RuntimeError(f"datacache mount printed pid {mount.pid}, state file says {state}")
        mount.log = state.get("log", "")
        return mount

    def datacache_uring(self, label: str, home: str, mountpoint: str, read_mode: str = "auto") -> tuple[Mount, str]:
        """:meth:`datacache` with ``-o io_uring`` (FUSE over io_uring, one ring queue per CPU), the
        fuse module's ``enable_uring`` turned on for its INIT and back after: ``(mount, problem)``,
        ``problem`` "" when the daemon serves its ring queues, else why it serves through
        ``/dev/fuse`` (the mount is up either way). Raises ``OSError`` where the kernel or this
        user cannot set the switch (nothing mounted)."""
        from datacache_fuse.kernel.ring_queue import enable_uring_while

        with enable_uring_while():
            mount = self.datacache(label, home, mountpoint, read_mode, options=("io_uring",))
        # The mount answers as soon as its last ring queue registers, possibly before the daemon
        # has logged it: its "mounted" line comes after the transport's.
        deadline = time.monotonic() + 10.0
        said = ""
        while "mounted " not in said and time.monotonic() < deadline:
            time.sleep(0.05)
            with open(mount.log, encoding="utf-8") as f:
                said = f.read()
        if "FUSE over io_uring:" in said:
            return mount, ""
        return mount, f"{label}: the daemon did not start its ring queues (see {mount.log}): it serves through /dev/fuse"

    def rclone(self, label: str, remote: str, mountpoint: str, config: str, endpoint: str, cache_dir: str,
               logfile: str, timeout: float = 60.0) -> Mount:
        os.makedirs(mountpoint, exist_ok=True)
        cmd = ["env", "-u", "AWS_CA_BUNDLE", "rclone", "mount", remote, mountpoint, "--config", config,
               "--s3-endpoint", endpoint, "--vfs-cache-mode", "full", "--cache-dir", cache_dir, "--read-only",
               "--dir-cache-time", "1h",
               "--log-file", logfile, "--log-level", "NOTICE"]
        with open(logfile, "ab") as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        # `env` execs rclone: the pid is rclone's.
        mount = Mount("rclone", label, mountpoint, proc.pid, proc=proc, log=logfile)
        self.mounts.append(mount)
        deadline = time.monotonic() + timeout
        while not is_fuse_mount(mountpoint):
            if proc.poll() is not None or time.monotonic() > deadline:
                with open(logfile, errors="replace") as f:
                    tail = f.read()[-2000:]
                raise RuntimeError(f"rclone mount did not come up (exit {proc.poll()}): {tail}")
            time.sleep(0.05)
        os.statvfs(mountpoint)
        return mount

    def unmount(self, mount: Mount) -> None:
        """Read the server's peak RSS, then unmount: ``datacache unmount`` for a datacache mount
        (it waits for the daemon to exit), ``fusermount3 -uz`` + SIGTERM for rclone; then make sure
        the process has ended."""
        if alive(mount.pid):
            mount.peak_rss_mib = tree_hwm_mib(mount.pid)
        if mount.kind == "datacache":
            r = subprocess.run([sys.executable, "-m", "datacache", "unmount", mount.mountpoint, "--home", mount.home],
                               capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=False)
            if r.returncode != 0:
                raise RuntimeError(f"datacache unmount {mount.mountpoint} failed: {r.stdout}{r.stderr}")
        else:
            _fusermount(mount.mountpoint)
            if mount.proc is not None and mount.proc.poll() is None:
                mount.proc.terminate()
        _stop_pid(mount)

    def cleanup(self) -> list[str]:
        """Remove every mount and stop every process started here; never raises. Returns
        problems seen (for the log)."""
        problems = []
        for mount in reversed(self.mounts):
            try:
                if mount.peak_rss_mib is None and alive(mount.pid):
                    mount.peak_rss_mib = tree_hwm_mib(mount.pid)
                _fusermount(mount.mountpoint)
                _stop_pid(mount)
                if is_fuse_mount(mount.mountpoint):
                    problems.append(f"{mount.mountpoint} is still mounted")
            except Exception as err:  # noqa: BLE001 - keep cleaning the others
                problems.append(f"{mount.mountpoint}: {type(err).__name__}: {err}")
        return problems


def _fusermount(mountpoint: str) -> None:
    if is_fuse_mount(mountpoint):
        subprocess.run(["fusermount3", "-u", "-z", mountpoint], capture_output=True, timeout=30, check=False)
    if is_fuse_mount(mountpoint):
        subprocess.run(["umount", "-l", mountpoint], capture_output=True, timeout=30, check=False)


def _stop_pid(mount: Mount, wait: float = 10.0) -> None:
    """Wait for the serving process to exit after its unmount, then SIGTERM, then SIGKILL. Only
    the pid this run started (the rclone child, or the daemon pid ``datacache mount`` printed)."""
    deadline = time.monotonic() + wait
    while alive(mount.pid) and time.monotonic() < deadline:
        if mount.proc is not None and mount.proc.poll() is not None:
            break
        time.sleep(0.05)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not alive(mount.pid):
            break
        try:
            os.kill(mount.pid, sig)
        except ProcessLookupError:
            break
        end = time.monotonic() + 5
        while alive(mount.pid) and time.monotonic() < end:
            time.sleep(0.05)
    if mount.group:
        try:
            os.killpg(mount.pid, signal.SIGKILL)  # what the daemon started and left behind
        except (ProcessLookupError, PermissionError):
            pass
    if mount.proc is not None:
        try:
            mount.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


def start_fuse(mounts: Mounts, kind: str, label: str, cmd: list[str], mountpoint: str, log: str,
               timeout: float = 60.0, env: dict[str, str] | None = None, group: bool = False) -> Mount:
    """Start a FUSE daemon ``cmd`` that stays in the foreground (its pid is our child's; ``env``
    execs) in a session of its own, output to ``log``, environment ``env`` (None: ours); record it
    in ``mounts`` (``group``: see ``Mount``) and wait up to ``timeout`` seconds for the mount.
    Raises RuntimeError with the log's tail when it exits or does not mount in time."""
    with open(log, "ab") as f:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=f, start_new_session=True, env=env)
    mount = Mount(kind, label, mountpoint, proc.pid, proc=proc, log=log, group=group)
    mounts.mounts.append(mount)
    deadline = time.monotonic() + timeout
    while not is_fuse_mount(mountpoint):
        if proc.poll() is not None or time.monotonic() > deadline:
            with open(log, errors="replace") as f:
                raise RuntimeError(f"{kind} did not mount (exit {proc.poll()}): {f.read()[-1000:]}")
        time.sleep(0.05)
    return mount


# -- results -------------------------------------------------------------------------------------

@dataclass
class Pass:
    seconds: float
    nbytes: int
    files: int
    server_cpu: float | None = None  # CPU seconds of the serving process (daemon / rclone)
    moto_cpu: float | None = None

    @property
    def mb_s(self) -> float:
        return self.nbytes / self.seconds / MB

    @property
    def files_s(self) -> float:
        return self.files / self.seconds


def median(passes: list[Pass]) -> Pass:
    """The median pass by time (the lower middle for an even count)."""
    ordered = sorted(passes, key=lambda p: p.seconds)
    return ordered[(len(ordered) - 1) // 2]


@dataclass
class Row:
    workload: str
    system: str
    role: str  # direct | peer | subject | info
    passes: list[Pass] = field(default_factory=list)
    files_col: bool = False  # print files/s


@dataclass
class Goal:
    vs_direct: float | None = None
    vs_peer: float | None = None  # x rclone


# -- the benchmark -------------------------------------------------------------------------------

class FuseReadBench:
    def __init__(self, args: argparse.Namespace, log: Callable[[str], None]):
        self.args = args
        self.log = log
        self.chunk = args.chunk_kib << 10
        self.mounts = Mounts()
        self.rows: dict[tuple[str, str], Row] = {}
        self.order: list[tuple[str, str]] = []
        self.notes: list[str] = []
        self.large_bytes = args.file_mib * MiB
        self.n_files = args.files
        self.moto_pid: int | None = None

    # -- bookkeeping -----------------------------------------------------------------------------
    def row(self, workload: str, system: str, role: str, files_col: bool = False) -> Row:
        key = (workload, system)
        if key not in self.rows:
            self.rows[key] = Row(workload, system, role, files_col=files_col)
            self.order.append(key)
        return self.rows[key]

    def timed(self, fn: Callable[[], tuple[int, int]], server_pid: int | None) -> Pass:
        s0 = cpu_seconds(server_pid) if server_pid else None
        m0 = cpu_seconds(self.moto_pid) if self.moto_pid else None
        t0 = time.perf_counter()
        nbytes, files = fn()
        seconds = time.perf_counter() - t0
        s1 = cpu_seconds(server_pid) if server_pid else None
        m1 = cpu_seconds(self.moto_pid) if self.moto_pid else None
        return Pass(seconds, nbytes, files,
                    s1 - s0 if s0 is not None and s1 is not None else None,
                    m1 - m0 if m0 is not None and m1 is not None else None)

    # -- data ------------------------------------------------------------------------------------
    def make_data(self, env: DemoEnvironment) -> None:
        rng = np.random.default_rng(12345)
        # the large file, in the Dataset's local mount
        self.large_path = os.path.join(env.local_dir, *LARGE_REL.split("/"))
        os.makedirs(os.path.dirname(self.large_path), exist_ok=True)
        h = hashlib.sha256()
        with open(self.large_path, "wb") as f:
            left = self.large_bytes
            while left:
                block = rng.bytes(min(LARGE_WRITE, left))
                h.update(block)
                f.write(block)
                left -= len(block)
        self.large_sum = h.hexdigest()
        self.model_path = os.path.join(env.local_dir, *MODEL_REL.split("/"))
        write_safetensors(self.model_path, self.large_bytes // 2)
        with open(self.model_path, "rb") as f:
            self.model_sum = hashlib.file_digest(f, "sha256").hexdigest()
        # the small files: written locally (the direct side), then uploaded
        self.small_root = env.path("small-local")
        self.small_rel: list[str] = []
        self.small_sums: list[str] = []
        for i in range(self.n_files):
            rel = f"c{i // FILES_PER_DIR:04d}/{i:06d}.jpg"
            data = rng.bytes(SMALL_FILE_BYTES)
            path = os.path.join(self.small_root, *rel.split("/"))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
            self.small_rel.append(rel)
            self.small_sums.append(hashlib.sha256(data).hexdigest())
        fs = env.s3.s3fs()  # straight to moto
        local = [os.path.join(self.small_root, *r.split("/")) for r in self.small_rel]
        remote = [f"demo-bucket/{JPEG_PREFIX}/{r}" for r in self.small_rel]
        for i in range(0, len(local), 500):
            fs.put(local[i:i + 500], remote[i:i + 500])
        fs.invalidate_cache()
        listed = fs.find(f"demo-bucket/{JPEG_PREFIX}", detail=True)
        if len(listed) != self.n_files or any(int(v["size"]) != SMALL_FILE_BYTES for v in listed.values()):
            raise RuntimeError(f"upload: {len(listed)} objects of {self.n_files} in the bucket")

    # -- homes -----------------------------------------------------------------------------------
    def make_home(self, env: DemoEnvironment, name: str, levels: list[dict]) -> str:
        """A fresh DATACACHE_HOME with the demo Dataset and a CacheRuntime of ``levels``."""
        docs = env.runtime_docs("default")
        for d in docs:
            if d["kind"] == "CacheRuntime":
                d["spec"]["tieredstore"]["levels"] = levels
        path = env.path(f"dataset-{name}.yaml")
        with open(path, "w") as f:
            yaml.safe_dump_all(docs, f, sort_keys=False)
        home = env.path(f"home-{name}")
        plane = Embedded(home)
        try:
            plane.apply(load_resources(path))
        finally:
            plane.close()
        return home

    @staticmethod
    def label(levels: list[dict]) -> str:
        return " + ".join(f"{lv['mediumtype']} {lv['quota']}" for lv in levels)

    # -- the run ---------------------------------------------------------------------------------
    def run(self) -> None:
        args, log = self.args, self.log
        log(f"==> demo environment (moto S3 on loopback) and data: a {self.large_bytes / MiB:,.0f} MiB file, "
            f"{self.n_files:,} files of {SMALL_FILE_BYTES:,} bytes")
        with DemoEnvironment(n_jpeg=0, shard_bytes=1, keep=args.keep) as env:
            self.moto_pid = env.s3.pid
            t0 = time.perf_counter()
            self.make_data(env)
            log(f"    data made and uploaded in {time.perf_counter() - t0:.1f}s under {env.work}")
            total = self.large_bytes + self.n_files * SMALL_FILE_BYTES
            ssd_quota = fmt_quantity(max(2 * GiB, math.ceil(total * 1.5 / GiB) * GiB))
            mem_quota = fmt_quantity(max(256 * MiB, math.ceil(self.n_files * SMALL_FILE_BYTES * 1.5 / MiB) * MiB))
            ssd = {"mediumtype": "SSD", "path": "cache/ssd", "quota": ssd_quota, "high": "0.95", "low": "0.8"}
            self.ssd_label = self.label([ssd])
            home_ssd = self.make_home(env, "ssd-only", [ssd])
            shared = dict(ssd, path=os.path.join(home_ssd, "cache", "ssd"))  # the same SSD directory
            mem = {"mediumtype": "MEM", "quota": mem_quota, "high": "0.95", "low": "0.7"}
            home_mem = self.make_home(env, "mem-ssd", [mem, shared])
            self.mem_label = self.label([mem, ssd]) + " (same SSD dir)"
            log(f"==> datacache warmup into [{self.ssd_label}]")
            plane = Embedded(home_ssd)
            try:
                t0 = time.perf_counter()
                _, result = plane.warmup(DATASET, ["local/" + LARGE_REL, "local/" + MODEL_REL,
                                                       "s3/" + JPEG_PREFIX])
                if not result.ok:
                    raise RuntimeError(f"warmup failed: {[(t.path, t.phase, t.failures[:3]) for t in result.targets]}")
                log(f"    warmed {sum(t.bytes for t in result.targets) / MB:,.0f} MB in "
                    f"{time.perf_counter() - t0:.1f}s")
            finally:
                plane.close()
            try:
                self.run_mounted(env, home_ssd, home_mem)
            finally:
                problems = self.mounts.cleanup()
                for p in problems:
                    print(f"cleanup: {p}", file=sys.stderr)
                if not args.keep and not problems:
                    remove_tree_parallel(env.work, keep_top=True)
            self.work = env.work

    def mount_uring(self, env: DemoEnvironment, home: str) -> Mount | None:
        """The SSD runtime mounted no-open with ``-o io_uring`` (FUSE over io_uring, one ring
        queue per CPU), the fuse module's ``enable_uring`` turned on for its INIT and back after;
        None (with a note) where the kernel or this user cannot."""
        label = f"datacache mount [{self.ssd_label}, no-open, -o io_uring]"
        try:
            mount, problem = self.mounts.datacache_uring(label, home, env.path("mnt-uring"), "no-open")
        except OSError as err:
            self.notes.append(f"no io_uring row: the fuse module's enable_uring cannot be set ({err})")
            return None
        if problem:  # the row would be mislabelled
            raise RuntimeError(problem)
        return mount

    def run_mounted(self, env: DemoEnvironment, home_ssd: str, home_mem: str) -> None:
        args, log = self.args, self.log
        # Each workload gets the read mode a mount would pick for a dataset of its kind (one
        # dataset holds both here): passthrough for the large files, no-open for the small ones.
        m_pt = self.mounts.datacache(f"datacache mount [{self.ssd_label}, passthrough]", home_ssd,
                                     env.path("mnt-pt"), "passthrough")
        m_ssd = self.mounts.datacache(f"datacache mount [{self.ssd_label}, no-open]", home_ssd,
                                      env.path("mnt-ssd"), "no-open")
        m_mem = self.mounts.datacache(f"datacache mount [{self.mem_label}, no-open]", home_mem,
                                      env.path("mnt-mem"), "no-open")
        m_uring = self.mount_uring(env, home_ssd)
        for m in (m_pt, m_ssd, m_mem, m_uring):
            if m is not None:
                log(f"    mounted: {m.mountpoint} (daemon pid {m.pid})")
        rclone_mount = None
        if not args.no_rclone:
            conf = env.path("rclone.conf")
            fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with open(fd, "w") as f:
                f.write("[moto]\ntype = s3\nprovider = Other\nenv_auth = false\naccess_key_id = testing\n"
                        "secret_access_key = testing\nregion = eu-west-1\nforce_path_style = true\n")
            rclone_mount = self.mounts.rclone(
                "rclone mount --vfs-cache-mode full", f"moto:demo-bucket/{JPEG_PREFIX}", env.path("mnt-rclone"),
                conf, env.s3.endpoint_url, env.path("rclone-cache"), env.path("rclone.log"))
            log(f"    mounted: {rclone_mount.mountpoint} (rclone pid {rclone_mount.pid})")

        # -- large files -----------------------------------------------------------------------
        def in_mount(rel: str) -> str:
            return os.path.join(m_pt.mountpoint, "local", *rel.split("/"))

        log("==> large files: one checked pass per side, then timed rounds")
        for path, digest in ((self.large_path, self.large_sum), (in_mount(LARGE_REL), self.large_sum),
                             (self.model_path, self.model_sum), (in_mount(MODEL_REL), self.model_sum)):
            read_paths([path], self.chunk, [digest])
        mib = f"{self.large_bytes / MiB:,.0f} MiB"
        w_cold = f"large file {mib}, page cache dropped"
        w_warm = f"large file {mib}, epoch 2 (page cache)"
        w_mmap = f"numpy.memmap copy of {mib}, page cache dropped"
        w_st = f"safetensors load_file {self.large_bytes // 2 / MiB:,.0f} MiB, page cache dropped"
        w_fio = f"fio randread bs=128k over {mib}, page cache dropped"
        fio_bytes = min(self.large_bytes, 256 * MiB)
        sides = [("direct read (local file)", "direct", self.large_path, self.model_path, None),
                 (m_pt.label, "subject", in_mount(LARGE_REL), in_mount(MODEL_REL), m_pt.pid)]
        for k in range(args.repeat):
            for name, role, large, model, pid in rotated(sides, k):
                drop_caches()
                cold = self.timed(lambda p=large: read_paths([p], self.chunk), pid)
                warm = self.timed(lambda p=large: read_paths([p], self.chunk), pid)
                self.row(w_cold, name, role).passes.append(cold)
                self.row(w_warm, name, role).passes.append(warm)
                drop_caches()
                self.row(w_mmap, name, role).passes.append(self.timed(lambda p=large: memmap_copy(p), pid))
                drop_caches()
                self.row(w_st, name, role).passes.append(self.timed(lambda p=model: safetensors_load(p), pid))
                if shutil.which("fio"):
                    drop_caches()
                    self.row(w_fio, name, role).passes.append(
                        self.timed(lambda p=large: fio_randread(p, fio_bytes), pid))
                log(f"    round {k + 1}: {name}: dropped {cold.mb_s:,.0f} MB/s, epoch 2 {warm.mb_s:,.0f} MB/s")
        if not shutil.which("fio"):
            self.notes.append("fio is not installed (Debian: fio): no randread row")
        epoch = [p.server_cpu for w in (w_cold, w_warm, w_mmap, w_st, w_fio) if (w, m_pt.label) in self.rows
                 for p in self.rows[(w, m_pt.label)].passes if p.server_cpu is not None]
        if epoch:
            self.notes.append(f"passthrough mount's daemon CPU over all {len(epoch)} timed large-file passes: "
                              f"{sum(epoch):.2f}s")

        # -- small files -----------------------------------------------------------------------
        direct = [os.path.join(self.small_root, *r.split("/")) for r in self.small_rel]
        systems = [("direct read (local copy)", "direct", direct, None)]
        if rclone_mount is not None:
            systems.append((f"{rclone_mount.label}, 2nd+ pass", "peer",
                            [os.path.join(rclone_mount.mountpoint, *r.split("/")) for r in self.small_rel],
                            rclone_mount.pid))
        for m in (m_ssd, m_mem, m_uring):
            if m is None:
                continue
            systems.append((m.label, "subject",
                            [os.path.join(m.mountpoint, "s3", *JPEG_PREFIX.split("/"), *r.split("/"))
                             for r in self.small_rel], m.pid))
        log(f"==> {self.n_files:,} small files: one checked pass per system (8 threads; fills rclone's vfs cache)")
        for name, _, paths, _ in systems:
            s = verify_parallel(paths, self.small_sums, self.chunk)
            log(f"    {name}: first pass {s:.1f}s")
            if name.startswith("rclone"):
                self.notes.append(f"rclone's vfs cache filled from moto by the checked first pass "
                                  f"(8 threads) in {s:.1f}s")
        w_sw = f"{self.n_files:,} files x 100 KB, {READERS} processes, warm"
        w_su = f"{self.n_files:,} files x 100 KB, {READERS} processes, warm, open(buffering=0)"
        w_sc = (f"{self.n_files:,} files x 100 KB, {READERS} processes, page cache dropped"
                + (f" ({args.cold_rounds} pass{'es' if args.cold_rounds > 1 else ''})"
                   if args.cold_rounds != args.repeat else ""))
        with ProcessReaders(READERS) as readers:
            # All warm rounds first: a drop_caches (below) would leave the next "warm" pass cold.
            for k in range(args.repeat):
                for name, role, paths, pid in rotated(systems, k):
                    warm = self.timed(lambda p=paths: readers.read(p), pid)
                    self.row(w_sw, name, role, files_col=True).passes.append(warm)
                    log(f"    round {k + 1}: {name}: warm {warm.files_s:,.0f} files/s")
                for name, role, paths, pid in rotated(systems, k):  # no isatty() ioctl: no goal
                    if role != "peer":
                        raw = self.timed(lambda p=paths: readers.read(p, buffered=False), pid)
                        self.row(w_su, name, "info" if role == "subject" else role, files_col=True).passes.append(raw)
            for k in range(args.cold_rounds):
                for name, role, paths, pid in rotated(systems, k):
                    drop_caches()
                    cold = self.timed(lambda p=paths: readers.read(p), pid)
                    self.row(w_sc, name, role, files_col=True).passes.append(cold)
                    log(f"    round {k + 1}: {name}: page cache dropped {cold.files_s:,.0f} files/s")

        # -- profile ---------------------------------------------------------------------------
        # (after the page-cache-dropped rounds: the warm workload is made warm again first)
        # Issue 17's goals; the small-file rows also >= 2x rclone's vfs cache when it runs.
        peer = 2.0 if rclone_mount else None
        self.goals = {w_cold: Goal(0.95), w_warm: Goal(0.9), w_mmap: Goal(0.9), w_st: Goal(0.9), w_fio: Goal(0.9),
                      w_sw: Goal(0.8, peer), w_sc: Goal(0.7, peer)}
        if args.profile:  # read_paths() workloads only: the large file's two rows and the small files'
            missed = {w for w, g in self.goals.items() if not self.met(w)[0]}
            profiled = [(w, [(n, [lg], pid) for n, _, lg, _, pid in sides]) for w in (w_cold, w_warm)]
            profiled += [(w, [(n, paths, pid) for n, _, paths, pid in systems]) for w in (w_sw, w_sc)]
            for w, subjects in profiled:
                if w not in missed:
                    continue
                for name, paths, pid in subjects:
                    if pid is None or name.startswith("rclone"):
                        continue
                    cold = w in (w_cold, w_sc)
                    if not cold:
                        read_paths(paths, self.chunk)  # warm again after the dropped rounds
                    self.profile(w, name, pid, paths, cold=cold)

        for m in self.mounts.mounts:
            self.mounts.unmount(m)
        for m in self.mounts.mounts:
            if is_fuse_mount(m.mountpoint) or alive(m.pid):
                raise RuntimeError(f"{m.label}: still mounted or running after unmount (pid {m.pid})")

    # -- profiling -------------------------------------------------------------------------------
    def profile(self, workload: str, system: str, pid: int, paths: list[str], cold: bool,
                top: int = 14, seconds: float = 4.0) -> None:
        """py-spy the daemon ``pid`` while ``paths`` are read again and again for ``seconds`` (the
        page cache dropped before each pass when ``cold``); print where its time went."""
        spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
        if not os.path.exists(spy):
            self.notes.append("--profile: py-spy is not installed (pip install py-spy)")
            return
        fd, out = tempfile.mkstemp(prefix=f"fuse-read-pyspy-{pid}-", suffix=".txt")
        os.close(fd)
        prof = subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", "250", "--format", "raw",
                                 "--output", out, "--threads", "--nonblocking"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        passes = []
        try:
            time.sleep(1.0)  # let it attach
            t_end = time.monotonic() + seconds
            while not passes or time.monotonic() < t_end:
                if cold:
                    drop_caches()
                passes.append(self.timed(lambda: read_paths(paths, self.chunk), pid))
        finally:
            prof.send_signal(signal.SIGINT)
            try:
                _, err = prof.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                prof.kill()
                _, err = prof.communicate()
        wall = sum(p.seconds for p in passes)
        cpu = sum(p.server_cpu or 0.0 for p in passes)
        print(f"\n--- py-spy: daemon pid {pid} during {len(passes)} more pass(es) of '{workload}', {system}: "
              f"{wall:.2f}s wall, daemon CPU {cpu:.2f}s ---")
        try:
            print(summarize_pyspy(out, top))
        except OSError:
            print(f"(py-spy wrote nothing: {err.decode(errors='replace')[-500:]})")
        finally:
            if os.path.exists(out):
                os.unlink(out)

    # -- table -----------------------------------------------------------------------------------
    def met(self, workload: str) -> tuple[bool, list[str]]:
        """(all subjects met the goal, per-subject verdicts) for a workload with a goal."""
        goal = self.goals.get(workload)
        rows = [self.rows[k] for k in self.order if k[0] == workload]
        direct = next((median(r.passes) for r in rows if r.role == "direct"), None)
        peer = next((median(r.passes) for r in rows if r.role == "peer"), None)
        ok_all, verdicts = True, []
        for r in rows:
            if r.role != "subject" or goal is None:
                continue
            s = median(r.passes)
            ok = True
            if goal.vs_direct is not None and direct is not None:
                ok &= s.mb_s >= goal.vs_direct * direct.mb_s
            if goal.vs_peer is not None and peer is not None:
                ok &= s.mb_s >= goal.vs_peer * peer.mb_s
            ok_all &= ok
            verdicts.append("yes" if ok else "no")
        return ok_all, verdicts

    def table(self) -> tuple[str, int, int]:
        rows_out, met_n, goal_n = [], 0, 0
        workloads = list(dict.fromkeys(k[0] for k in self.order))
        for w in workloads:
            rows = [self.rows[k] for k in self.order if k[0] == w]
            goal = getattr(self, "goals", {}).get(w)
            direct = next((median(r.passes) for r in rows if r.role == "direct"), None)
            peer = next((median(r.passes) for r in rows if r.role == "peer"), None)
            for r in rows:
                s = median(r.passes)
                ratio = []
                if direct is not None and r.role != "direct":
                    ratio.append(f"{s.mb_s / direct.mb_s:.2f}x direct")
                if peer is not None and r.role in ("subject", "info"):
                    ratio.append(f"{s.mb_s / peer.mb_s:.2f}x rclone")
                gtext, met = "-", ""
                if r.role == "direct":
                    gtext = "(ceiling)"
                elif r.role == "peer":
                    gtext = "(peer)"
                elif r.role == "subject" and goal is not None:
                    parts, ok = [], True
                    if goal.vs_direct is not None and direct is not None:
                        parts.append(f">={goal.vs_direct:g}x direct")
                        ok &= s.mb_s >= goal.vs_direct * direct.mb_s
                    if goal.vs_peer is not None and peer is not None:
                        parts.append(f">={goal.vs_peer:g}x rclone")
                        ok_peer = s.mb_s >= goal.vs_peer * peer.mb_s
                        ok &= ok_peer
                    gtext = ", ".join(parts)
                    met = "yes" if ok else "no"
                    goal_n += 1
                    met_n += ok
                rows_out.append([w, r.system, f"{s.mb_s:,.0f}", f"{s.files_s:,.0f}" if r.files_col else "-",
                                 ", ".join(ratio) or "-", gtext, met])
        headers = ["workload", "system", "MB/s", "files/s", "ratio", "goal", "met"]
        return format_table(headers, rows_out, right={2, 3}), met_n, goal_n

    def pass_notes(self) -> list[str]:
        out = []
        for k in self.order:
            r = self.rows[k]
            rates = [p.files_s if r.files_col else p.mb_s for p in r.passes]
            unit = "files/s" if r.files_col else "MB/s"
            s = median(r.passes)
            cpu = f", server CPU {s.server_cpu:.2f}s of {s.seconds:.2f}s wall" if s.server_cpu is not None else ""
            if s.moto_cpu is not None and r.role != "direct":
                cpu += f", moto CPU {s.moto_cpu:.2f}s"
            # moto idles at a few ms of CPU a second (its watchdog and accept loop): flag more than that
            busy = max((p.moto_cpu or 0.0) - 0.01 * p.seconds for p in r.passes)
            warn = (f"; WARNING: moto used {busy + 0.01 * s.seconds:.2f}s CPU in a timed pass"
                    if busy > 0.05 and r.role != "direct" else "")
            out.append(f"{r.workload} | {r.system}: passes {min(rates):,.0f}-{max(rates):,.0f} {unit}{cpu}{warn}")
        return out


_IDLE_LEAVES = ("Session._worker (datacache_fuse/kernel/session.py", "_worker (concurrent/futures/thread.py",
                "Condition.wait (threading.py", "Thread._wait_for_tstate_lock (threading.py",
                "Event.wait (threading.py")
_OURS = ("datacache/", "datacache_fuse/", "diskcache/", "xxhash")


def summarize_pyspy(path: str, top: int) -> str:
    """Where the daemon's time went, from py-spy's raw output (``thread (tid): name;frame;...
    count`` per line): samples per thread, the top functions by own (leaf) samples, and the
    datacache / diskcache functions by total (inclusive) samples. Samples whose leaf is an idle
    wait (a session worker's read of ``/dev/fuse``, a pool thread's queue) are counted apart."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    busy = idle = 0
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not count.isdigit():
                continue
            frames = stack.split(";")
            thread, frames = frames[0], frames[1:]
            if not frames:
                continue
            n = int(count)
            if frames[-1].startswith(_IDLE_LEAVES):
                idle += n
                continue
            busy += n
            threads[thread.split(":", 1)[-1].strip()] += n
            own[frames[-1]] += n
            for fr in set(frames):
                if any(o in fr for o in _OURS):
                    total[fr] += n
    if not busy:
        return f"(no busy samples; {idle} idle)"
    lines = [f"busy samples {busy} (idle waits left out: {idle}); by thread: "
             + ", ".join(f"{t} {n}" for t, n in threads.most_common(6))]
    lines.append("  own %  function (leaf frames)")
    lines += [f"  {100 * n / busy:5.1f}  {fn}" for fn, n in own.most_common(top)]
    lines.append("  total %  datacache / diskcache function (inclusive)")
    lines += [f"  {100 * n / busy:5.1f}  {fn}" for fn, n in total.most_common(top)]
    return "\n".join(lines)


# -- main ----------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.fuse_read", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes: 2,000 files, a 128 MiB file")
    ap.add_argument("--files", type=int, default=None, help="small files (default 10,000; --quick 2,000)")
    ap.add_argument("--file-mib", type=int, default=None, help="large file in MiB (default 1024; --quick 128)")
    ap.add_argument("--repeat", type=int, default=3, help="timed passes per figure; the median is shown (default 3)")
    ap.add_argument("--chunk-kib", type=int, default=1024, help="readinto() size on every side (default 1024)")
    ap.add_argument("--no-rclone", action="store_true", help="leave rclone out")
    ap.add_argument("--cold-rounds", type=int, default=1,
                    help="timed passes of the small-file rows with the page cache dropped (default 1)")
    ap.add_argument("--profile", action="store_true",
                    help="py-spy the FUSE daemon during one more pass of each workload that missed its goal")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--quiet", action="store_true", help="print only the table and the notes")
    args = ap.parse_args(argv)
    args.files = args.files if args.files is not None else (2000 if args.quick else 10_000)
    args.file_mib = args.file_mib if args.file_mib is not None else (128 if args.quick else 1024)
    if min(args.files, args.file_mib, args.repeat, args.chunk_kib, args.cold_rounds) < 1:
        ap.error("--files, --file-mib, --repeat, --cold-rounds and --chunk-kib must be >= 1")
    if not os.access(DROP_CACHES, os.W_OK):
        ap.error(f"{DROP_CACHES} is not writable: run as root (the page cache is dropped between sides)")
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        ap.error("needs /dev/fuse and fusermount3 (Debian: fuse3)")
    if not args.no_rclone and shutil.which("rclone") is None:
        ap.error("rclone is not installed (Debian: rclone); or pass --no-rclone")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log = (lambda s: None) if args.quiet else (lambda s: print(s, flush=True))
    t_start = time.perf_counter()
    bench = FuseReadBench(args, log)
    bench.run()
    elapsed = time.perf_counter() - t_start
    text, met_n, goal_n = bench.table()

    print()
    print(f"datacache FUSE read benchmark - {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
          f"Linux {os.uname().release}; {'quick' if args.quick else 'full'} run: a {args.file_mib:,} MiB file, "
          f"{args.files:,} files of {SMALL_FILE_BYTES:,} bytes")
    print(f"reads: large file open(path, 'rb', buffering=0) + readinto() of {args.chunk_kib} KiB until EOF; "
          f"small files {READERS} processes, open() + read(); figures: median of {args.repeat} timed pass(es); "
          "MB = 10^6 bytes")
    print(f"runtimes: large files [{bench.ssd_label}] mounted --read-mode passthrough; small files "
          f"[{bench.ssd_label}] and [{bench.mem_label}] mounted --read-mode no-open (the SSD one also "
          f"with -o io_uring); blockSize 4Mi; "
          "all blocks warmed up before mounting")
    print()
    print(text)
    print()
    for m in bench.mounts.mounts:
        rss = f"{m.peak_rss_mib:,.0f} MiB" if m.peak_rss_mib is not None else "unknown"
        print(f"  peak RSS (VmHWM) of {m.label}: {rss} (pid {m.pid})")
    for line in bench.pass_notes():
        print(f"  {line}")
    for note in bench.notes:
        print(f"  note: {note}")
    own, _ = peak_rss_mib()
    print(f"  goals met: {met_n}/{goal_n}; total time {elapsed:.1f}s; this process's peak RSS {own:,.0f} MiB")
    if args.keep:
        print(f"temporary directory kept: {bench.work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
