"""The systems ``python -m benchmarks`` compares, each reading the same bucket through the same proxy.

A ``System`` starts with an empty cache (``begin``: a fresh cache directory, and a fresh mount
for the FUSE ones) and returns the ``loader.Opener`` its readers use; ``warmup`` fills its
cache (or copy) with the files of its tasks and returns what it moved; ``end`` unmounts and keeps the serving
process's peak RSS (``VmHWM``). Roles: ``local`` (the plain local copy: the limit), ``datacache``
(the subject) and ``peer``.

- ``LocalCopy``: copies every object with parallel GETs (one per object, ``COPY_CONCURRENCY``
  objects in flight, s3fs's ``get``) - the best a plain copy can do from this source, and the
  measure of what the delayed source delivers; reads ``open()`` the copy.
- ``DatacacheFuse`` / ``DatacacheFsspec``: a fresh ``DATACACHE_HOME`` with the demo Dataset and
  CacheRuntime; warmup is the engine of ``datacache warmup`` on the folders
  (``s3/shards s3/parquet``), in a child process (``benchmarks.warmup_child``: its own peak RSS); reads go through ``datacache mount`` or ``datacache://``.
- ``FsspecCache``: ``simplecache::s3://`` (whole files) or ``blockcache::s3://`` (blocks) over s3fs.
- ``RcloneMount``: ``rclone mount --vfs-cache-mode full`` (Debian's rclone; ``fuse_read.Mounts``).
- ``S3fsFuse``: ``s3fs -f -o use_cache=DIR`` (Debian's s3fs-fuse), read-only.

Peers have no warmup command: their ``warmup`` reads every file once through the system with the
reader pool (``workers`` processes), which is how a user fills their caches. Mount-based systems
need ``/dev/fuse`` and ``fusermount3``; one whose program is missing says so in ``missing`` and
is reported as "not installed".
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time

from benchmarks.common import BUCKET, DATASET, DemoEnvironment, rclone_s3_config, s3fs_fuse_passwd
from benchmarks.fuse_read import Mount, Mounts, is_fuse_mount
from benchmarks.loader import Opener, ReaderPool, Result, Task
from datacache.demo.s3server import DEFAULT_REGION

__all__ = ["SYSTEMS", "System", "make_systems"]

COPY_CONCURRENCY = 16  # objects in flight during the plain copy


class System:
    """One system under test; see the module doc. ``missing``: why it cannot run, or ""."""

    name = ""
    role = "peer"
    program = ""  # an executable it needs ("" for none)
    fuse = False

    def __init__(self, env: DemoEnvironment, mounts: Mounts):
        self.env = env
        self.mounts = mounts
        self.mount: Mount | None = None
        self.daemon_rss_mib: float | None = None  # the serving process (FUSE daemon)
        self.warmup_rss_mib: float | None = None  # the warmup process, where it is one

    @property
    def missing(self) -> str:
        if self.program and shutil.which(self.program) is None:
            return f"not installed ({self.program} not found)"
        if self.fuse and (not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None):
            return "not installed (needs /dev/fuse and fusermount3)"
        return ""

    @property
    def slug(self) -> str:
        """The name in letters, digits and dashes (for directory names)."""
        return "".join(c if c.isalnum() else "-" for c in self.name.lower()).strip("-")

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

    def end(self) -> None:
        """Unmount (keeping the daemon's peak RSS). Idempotent."""
        if self.mount is not None:
            self.mounts.unmount(self.mount)
            self.daemon_rss_mib = self.mount.peak_rss_mib
            self.mount = None


class LocalCopy(System):
    """The plain local copy (the limit): parallel GETs into a directory, read with ``open()``."""

    name = "local copy (the limit)"
    role = "local"

    def __init__(self, env: DemoEnvironment, mounts: Mounts):
        super().__init__(env, mounts)
        self.root = ""

    def _begin(self) -> Opener:
        self.root = self.dir("copy")
        return Opener("path", self.root, strip="s3/")

    def warmup(self, pool: ReaderPool | None, tasks: list[Task]) -> Result:
        t0 = time.perf_counter()
        nbytes = parallel_copy(self.env, [t.path for t in tasks], self.root)
        return Result(time.perf_counter() - t0, nbytes, len(tasks), [], 0.0)


def parallel_copy(env: DemoEnvironment, paths: list[str], root: str) -> int:
    """Copy the S3 objects of dataset ``paths`` (``s3/...``) to ``root`` through ``env``'s endpoint
    (the proxy): one GET per object, ``COPY_CONCURRENCY`` objects at a time (s3fs ``get``,
    ``max_concurrency=1``). Not ranged GETs: moto reads a whole object for every ranged GET, so on
    this source splitting an object makes it slower, not faster. Returns bytes copied."""
    fs = env.s3fs(max_concurrency=1)
    local = [os.path.join(root, p[len("s3/"):]) for p in paths]
    for dst in local:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
    fs.get([env.s3_key(p) for p in paths], local, batch_size=COPY_CONCURRENCY)
    copied = sum(os.path.getsize(dst) for dst in local)
    want = sum(env.sizes[p] for p in paths)
    if copied != want:
        raise RuntimeError(f"the local copy has {copied} bytes, the bucket {want}")
    return copied


class Datacache(System):
    """Shared by both datacache systems: a fresh ``DATACACHE_HOME`` and the warmup engine."""

    role = "datacache"

    def __init__(self, env: DemoEnvironment, mounts: Mounts):
        super().__init__(env, mounts)
        self.home = ""

    def new_home(self) -> str:
        home, plane = self.env.new_home()
        plane.close()
        self.home = home
        return home

    def warmup(self, pool: ReaderPool | None, tasks: list[Task]) -> Result:
        """The warmup engine on the folders of ``tasks`` (``s3/shards``, ...) in a child process
        (``benchmarks.warmup_child``: timed around the warmup call, its own peak RSS)."""
        targets = sorted({"/".join(t.path.split("/")[:2]) for t in tasks})
        cmd = [sys.executable, "-m", "benchmarks.warmup_child", self.home, DATASET, *targets]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, stdin=subprocess.DEVNULL, check=False)
        try:
            out = json.loads(r.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            return Result(0.0, 0, 0, [f"warmup exited {r.returncode}: {(r.stdout + r.stderr)[-500:]}"], 0.0)
        self.warmup_rss_mib = out["vm_hwm_mib"]
        want = sum(self.env.sizes[t.path] for t in tasks)
        errors = [] if out["ok"] and out["bytes"] == want else [f"warmup: ok={out['ok']}, {out['bytes']} of {want} "
                                                                 f"bytes, {out['failures']}"]
        return Result(out["seconds"], out["bytes"], out["files"], errors, 0.0)


class DatacacheFuse(Datacache):
    """``datacache mount`` of a fresh home; readers ``open()`` files under the mount point."""

    name = "datacache FUSE mount"
    fuse = True

    def _begin(self) -> Opener:
        # Mounted before its warmup: the daemon and `datacache warmup` share the SSD tier.
        self.mount = self.mounts.datacache(self.name, self.new_home(), self.dir("mnt"))
        return Opener("path", self.mount.mountpoint)


class DatacacheFsspec(Datacache):
    """``fsspec.filesystem("datacache", home=...)`` in every reader process."""

    name = "datacache:// (fsspec)"

    def _begin(self) -> Opener:
        return Opener("fsspec", f"{DATASET}/", protocol="datacache", options={"home": self.new_home()})


class FsspecCache(System):
    """fsspec's ``simplecache`` or ``blockcache`` (``protocol``) over s3fs, a fresh cache directory."""

    def __init__(self, env: DemoEnvironment, mounts: Mounts, protocol: str):
        super().__init__(env, mounts)
        self.protocol = protocol
        self.name = f"fsspec {protocol}::s3"

    def _begin(self) -> Opener:
        options = {"target_protocol": "s3", "target_options": self.env.storage_options(),
                   "cache_storage": self.dir("cache")}
        return Opener("fsspec", f"{BUCKET}/", strip="s3/", protocol=self.protocol,
                      options=options)


class RcloneMount(System):
    """``rclone mount --vfs-cache-mode full`` of the bucket (``fuse_read.Mounts.rclone``)."""

    name = "rclone mount --vfs-cache-mode full"
    program = "rclone"
    fuse = True

    def _begin(self) -> Opener:
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
        with open(log, "ab") as f:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=f, start_new_session=True)
        self.mount = Mount("s3fs", self.name, mountpoint, proc.pid, proc=proc, log=log)  # env execs s3fs
        self.mounts.mounts.append(self.mount)
        deadline = time.monotonic() + 60
        while not is_fuse_mount(mountpoint):
            if proc.poll() is not None or time.monotonic() > deadline:
                with open(log, errors="replace") as f:
                    raise RuntimeError(f"s3fs did not mount (exit {proc.poll()}): {f.read()[-1000:]}")
            time.sleep(0.05)
        return Opener("path", mountpoint, strip="s3/")


SYSTEMS = ("local", "datacache-fuse", "datacache-fsspec", "simplecache", "blockcache", "rclone", "s3fs")


def make_systems(env: DemoEnvironment, mounts: Mounts, names: tuple[str, ...] = SYSTEMS) -> list[System]:
    """The systems named (keys of ``SYSTEMS``), in that order; raises ValueError on an unknown name."""
    makers = {
        "local": lambda: LocalCopy(env, mounts),
        "datacache-fuse": lambda: DatacacheFuse(env, mounts),
        "datacache-fsspec": lambda: DatacacheFsspec(env, mounts),
        "simplecache": lambda: FsspecCache(env, mounts, "simplecache"),
        "blockcache": lambda: FsspecCache(env, mounts, "blockcache"),
        "rclone": lambda: RcloneMount(env, mounts),
        "s3fs": lambda: S3fsFuse(env, mounts),
    }
    unknown = [n for n in names if n not in makers]
    if unknown:
        raise ValueError(f"unknown system(s) {', '.join(unknown)} (known: {', '.join(SYSTEMS)})")
    return [makers[n]() for n in names]
