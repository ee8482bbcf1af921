"""The JuiceFSRuntime engine: a JuiceFS Community Edition client as the cache of a Dataset.

As Fluid's JuiceFSRuntime does, the Dataset names the volume (mount ``juicefs:///[sub/dir]``,
metadata URL and object-storage keys by secret reference) and the runtime says how the client
caches (tieredstore levels -> ``--cache-dir``/``--cache-size``, MEM -> ``--buffer-size``) and
mounts (``fuse.options``). JuiceFS is the cache here: datacache's block cache is not on this
path, so every call of ``datacache.stack.engines.Engine`` is JuiceFS's own:

- ``setup``/``opener``: the runtime's own client, ``juicefs mount`` at
  ``$DATACACHE_HOME/runtimes/<ns>/<name>/juicefs/mnt`` (a :class:`FuseCommand`: detached,
  pid-checked, stopped by process group), through which the control plane lists the dataset
  (metadata sync), warms it up and asks for figures;
- ``mount_argv``: a reader's own foreground client at its mount point
  (:mod:`.juicefs_mount`), which ``datacache mount`` supervises (ENOTCONN recovery);
- ``load``: ``juicefs warmup`` over the targets' files in batches (progress after each batch),
  then ``juicefs warmup --check`` per target for what is cached;
- ``report``: files and bytes from ``juicefs info -r --strict``, cached bytes and percentage from
  ``juicefs warmup --check`` (never estimated);
- ``teardown``: stop the client; with ``clean_cache`` and policy ``OnRuntimeDeleted``, remove
  the cache directories.

A JuiceFS client indexes its cache directory when it starts, so warmup and the check go through
a reader's mount when one is live (its client then serves what was loaded), else the runtime's own.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass

from datacache import mountinfo
from datacache.api.models import JUICEFS_SECRETS
from datacache.cache.disk import default_free_space_ratio
from datacache.errors import ResourceError
from datacache.api.engine import Engine, EngineReport, EngineState
from datacache.ufs.secretfiles import secret_files, write_private
from datacache.warmup import Progress, TargetProgress, TargetResult, WarmupResult
from datacache_runtimes import juicefs_cli
from datacache_runtimes.fusecmd import CONFIG_VAR, TARGET_VAR, FuseCommand
from datacache_runtimes.juicefs_mount import reader_record
from datacache_runtimes.thin_engine import MountedDirFileSystem

MOUNT_TIMEOUT = 60.0  # seconds for a client to mount (it connects to the metadata engine first)
BATCH_FILES, BATCH_BYTES = 256, 256 << 20  # one juicefs warmup per batch: progress between batches


VIRTUAL = frozenset({".accesslog", ".config", ".stats", ".trash", ".control"})
"""Entries a JuiceFS client shows at its mount's root that are not the volume's files."""


class JuiceFSMountFileSystem(MountedDirFileSystem):
    """The runtime's own client mount read as local files (for the metadata sync), without the
    :data:`VIRTUAL` entries at its root ``root``."""

    def __init__(self, root: str, **kwargs):
        super().__init__(**kwargs)
        self.root = root

    def ls(self, path, detail=False, **kwargs):
        entries = super().ls(path, detail=detail, **kwargs)
        if self._strip_protocol(path).rstrip("/") != self.root:
            return entries
        return [e for e in entries if os.path.basename((e["name"] if detail else e).rstrip("/")) not in VIRTUAL]


@dataclass(frozen=True)
class _Command:
    """What :class:`FuseCommand` runs: the argv and how long it may take to mount."""

    command: list[str]
    mount_timeout: float = MOUNT_TIMEOUT


class JuiceFSEngine(Engine):
    """JuiceFSRuntime ``runtime`` (a model), state under ``home``; see the module docstring."""

    reads_through_datacache = False

    def __init__(self, runtime, home: str):
        self.runtime, self.home = runtime, home
        meta = runtime.metadata
        self.who = f"juicefsruntime {meta.namespace}/{meta.name}"
        self.fuse = FuseCommand(home, meta.namespace, meta.name, kind="juicefs")
        self.readers_dir = os.path.join(self.fuse.dir, "readers")

    # -- configuration ---------------------------------------------------------------------------
    def _levels(self):
        store = self.runtime.spec.tieredstore
        return store.ordered_levels if store is not None else []

    def _dir(self, level) -> str:
        """A disk level's JuiceFS ``--cache-dir``: where a CacheRuntime's level would be."""
        return level.directory(self.home, self.runtime.metadata.namespace, self.runtime.metadata.name)

    def flags(self, extra_options=()) -> list[str]:
        """``juicefs mount`` flags from the runtime's tieredstore and fuse options; ``extra_options``
        (``-o`` values of ``datacache mount``) go on as ``-o``."""
        levels = [(lv.mediumtype, self._dir(lv) if lv.path else "", lv.quota_bytes,
                   default_free_space_ratio() if lv.free_space_ratio is None else lv.free_space_ratio)
                  for lv in self._levels()]
        flags = juicefs_cli.mount_flags(levels, self.runtime.spec.fuse.options)
        for opt in extra_options:
            flags += ["-o", opt]
        return flags

    def config(self, dataset, extra_options=()) -> dict:
        """The mount config of ``dataset`` (secret file paths, never values). Raises
        ``ResourceError`` naming the field for a mount that is not one ``juicefs:///`` with a
        ``metaurl`` secret, or a secret that cannot be found, or no ``juicefs`` binary."""
        meta = dataset.metadata
        where = f"dataset {meta.namespace}/{meta.name}: spec.mounts"
        mounts = dataset.spec.mounts
        if len(mounts) != 1 or mounts[0].scheme != "juicefs":
            raise ResourceError(f"{where}: a JuiceFSRuntime serves exactly one mount 'juicefs:///[sub/dir]' "
                                f"(found {', '.join(repr(m.mount_point) for m in mounts)}); bind other mounts "
                                f"to a CacheRuntime")
        mount = mounts[0]
        if mount.options:
            raise ResourceError(f"{where}[0].options: a juicefs mount takes none (got {', '.join(sorted(mount.options))});"
                                f" the volume's settings come from 'juicefs format', the client's from the "
                                f"JuiceFSRuntime's fuse.options")
        unknown = sorted({o.name for o in mount.encrypt_options} - JUICEFS_SECRETS)
        if unknown or "metaurl" not in {o.name for o in mount.encrypt_options}:
            raise ResourceError(f"{where}[0].encryptOptions: give 'metaurl' (the metadata URL, by secretKeyRef) and "
                                f"optionally 'access-key'/'secret-key'" + (f"; unknown: {', '.join(unknown)}"
                                                                           if unknown else ""))
        secrets = secret_files(mount, self.home, f"{where}[0]")
        return {"binary": juicefs_cli.binary(), "metaurl": secrets["metaurl"], "accessKey": secrets.get("access-key"),
                "secretKey": secrets.get("secret-key"), "subdir": mount.mount_point.split("://", 1)[1].strip("/"),
                "flags": self.flags(extra_options), "readersDir": self.readers_dir,
                "mounts": [{"targetPath": self.fuse.target}]}

    # -- Engine ----------------------------------------------------------------------------------
    def setup(self, dataset) -> None:
        """Mount the runtime's own client (or keep it); raises ``ResourceError`` within
        :data:`MOUNT_TIMEOUT` seconds with JuiceFS's own (redacted) output when it cannot."""
        command = _Command([sys.executable, "-m", "datacache_runtimes.juicefs_mount", f"$({CONFIG_VAR})",
                            f"$({TARGET_VAR})"])
        self.fuse.ensure(command, self.config(dataset), self.who,
                         fix="check the Dataset's metaurl secret (the volume must be formatted: juicefs format) "
                             "and the JuiceFSRuntime's fuse.options")

    def state(self) -> EngineState:
        if self.fuse.running():
            return EngineState()
        return EngineState("NotReady", f"{self.who}: its JuiceFS client is not mounted (it mounts when the dataset "
                                       "is applied, loaded or read)")

    def opener(self, dataset):
        self.setup(dataset)
        local = JuiceFSMountFileSystem(self.fuse.target)
        return lambda mount, where: (local, self.fuse.target)

    def mount_argv(self, dataset, mountpoint: str, options=()) -> list[str]:
        """``juicefs mount`` in the foreground at ``mountpoint`` for a reader (its config written
        beside the runtime's own, 0600)."""
        path = os.path.join(self.fuse.dir, "reader-" + os.path.basename(reader_record("", mountpoint)))
        os.makedirs(self.fuse.dir, mode=0o700, exist_ok=True)
        write_private(path, json.dumps(self.config(dataset, options)))
        return [sys.executable, "-m", "datacache_runtimes.juicefs_mount", path, mountpoint, "--reader"]

    def reader_mounts(self) -> list[str]:
        """Mount points where readers' JuiceFS clients of this runtime are mounted now."""
        live = {e.mountpoint for e in mountinfo.mounts()}
        found = []
        for entry in sorted(glob.glob(os.path.join(self.readers_dir, "*.json"))):
            try:
                with open(entry, encoding="utf-8") as f:
                    point = json.load(f)["mountpoint"]
            except (OSError, ValueError, KeyError):
                continue
            if point in live:
                found.append(point)
        return found

    def _served_at(self, dataset) -> str:
        """The mount to warm up and check through: a live reader's, else the runtime's own."""
        readers = self.reader_mounts()
        if readers:
            return readers[0]
        self.setup(dataset)
        return self.fuse.target

    def _juicefs(self, dataset, args: list[str], what: str) -> str:
        config = self.config(dataset)
        _, env, hidden = juicefs_cli.volume_args(config)
        return juicefs_cli.run([config["binary"], *args], env, hidden, f"{self.who}: {what}")

    def report(self, dataset) -> EngineReport:
        """Files and bytes (``juicefs info``), cached bytes and percentage (``juicefs warmup
        --check``) of the whole dataset; capacity: the disk levels' quotas. Raises ``ResourceError``
        (also when no client of the runtime is mounted: a status read starts none)."""
        root = (self.reader_mounts() or [self.fuse.target if self.fuse.running() else None])[0]
        if root is None:
            raise ResourceError(self.state().reason)
        files, total = juicefs_cli.parse_info(self._juicefs(dataset, ["info", "-r", "--strict", root], "info"))
        _, cached, pct = juicefs_cli.parse_check(self._juicefs(dataset, ["warmup", "--check", root], "warmup --check"))
        return EngineReport(files=files, ufs_total=total, cached=min(cached, total), capacity=self.usage()[0],
                            cached_percentage=pct)

    def load(self, dataset, targets: list[str], on_progress=None, cancel=None) -> WarmupResult:
        """``juicefs warmup`` of ``targets`` (dataset paths, globs allowed; empty: everything), in
        batches with ``on_progress(Progress)`` after each; then ``--check`` per target. ``cancel``
        (an Event) stops between batches. Raises ``ResourceError`` when the client cannot mount."""
        root = self._served_at(dataset)
        t0 = time.monotonic()
        chosen = [(t, _files_under(root, t)) for t in (targets or ["/"])]
        progress = Progress(targets=[TargetProgress(t, len(fs), sum(s for _, s in fs)) for t, fs in chosen])
        progress.files_total = sum(p.files_total for p in progress.targets)
        progress.bytes_total = sum(p.bytes_total for p in progress.targets)
        results, cancelled = [], False
        for (target, files), tp in zip(chosen, progress.targets):
            failures = []
            for batch in _batches(files):
                if cancel is not None and cancel.is_set():
                    cancelled = True
                    break
                try:
                    self._warm(dataset, [p for p, _ in batch])
                except ResourceError as err:
                    failures.append(str(err))
                    continue
                n, size = len(batch), sum(s for _, s in batch)
                tp.files_done += n
                tp.bytes_done += size
                progress.files_done += n
                progress.bytes_done += size
                progress.bytes_loaded += size
                if on_progress is not None:
                    on_progress(progress)
            results.append(self._checked(dataset, target, root, files, failures, cancelled))
        return WarmupResult(results, time.monotonic() - t0, progress.bytes_loaded, cancelled=cancelled)

    def _warm(self, dataset, paths: list[str]) -> None:
        listing = os.path.join(self.fuse.dir, "warmup.list")
        write_private(listing, "".join(p + "\n" for p in paths))
        self._juicefs(dataset, ["warmup", "-f", listing], "warmup")

    def _checked(self, dataset, target, root, files, failures, cancelled) -> TargetResult:
        total = sum(s for _, s in files)
        result = TargetResult(target, files=len(files), bytes=total, failures=failures)
        if files:
            listing = os.path.join(self.fuse.dir, "check.list")
            write_private(listing, "".join(p + "\n" for p, _ in files))
            _, cached, pct = juicefs_cli.parse_check(self._juicefs(dataset, ["warmup", "--check", "-f", listing],
                                                                   "warmup --check"))
            complete = pct == "100.0%"
            result.cached_bytes = total if complete else min(cached, total)
            result.cached_files = len(files) if complete else 0
        else:
            complete = True
        result.phase = "Complete" if complete and not failures else "Cancelled" if cancelled else "Failed"
        if result.phase == "Failed" and not failures:
            result.failures.append(f"{target}: juicefs warmup --check reports it not completely cached")
        return result

    def usage(self) -> tuple[int, int]:
        """``(capacity, used)``: the disk levels' quotas, and the bytes of the files in their
        cache directories now (JuiceFS's ``--cache-dir``)."""
        capacity = used = 0
        for lv in self._levels():
            if lv.mediumtype == "MEM":
                continue
            capacity += lv.quota_bytes
            for base, _dirs, names in os.walk(self._dir(lv)):
                for n in names:
                    try:
                        used += os.lstat(os.path.join(base, n)).st_size
                    except FileNotFoundError:  # evicted meanwhile
                        pass
        return capacity, used

    def teardown(self, clean_cache: bool = True) -> None:
        """Stop the runtime's client; with ``clean_cache`` and ``cleanCachePolicy: OnRuntimeDeleted``
        remove its cache directories. Readers' mounts are the caller's (``reader_mounts``)."""
        self.fuse.stop()
        if clean_cache and self.runtime.spec.clean_cache_policy == "OnRuntimeDeleted":
            for lv in self._levels():
                if lv.path is not None:
                    shutil.rmtree(self._dir(lv), ignore_errors=True)
            shutil.rmtree(self.fuse.dir, ignore_errors=True)


def _files_under(root: str, target: str) -> list[tuple[str, int]]:
    """``(path on the mount, size in bytes)`` of the regular files under dataset path ``target``
    (a file, a directory or a glob) on the client mounted at ``root``, without :data:`VIRTUAL`."""
    found = []
    for top in sorted(os.path.normpath(p) for p in glob.glob(os.path.join(root, target.lstrip("/")))):
        if os.path.dirname(top) == root and os.path.basename(top) in VIRTUAL:
            continue
        if os.path.isfile(top):
            found.append((top, os.path.getsize(top)))
        for base, dirs, names in os.walk(top):
            if base == root:
                dirs[:] = [d for d in dirs if d not in VIRTUAL]
                names = [n for n in names if n not in VIRTUAL]
            dirs.sort()
            found += [(os.path.join(base, n), os.path.getsize(os.path.join(base, n))) for n in sorted(names)]
    return found


def _batches(files: list[tuple[str, int]]):
    batch, size = [], 0
    for item in files:
        batch.append(item)
        size += item[1]
        if len(batch) >= BATCH_FILES or size >= BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def engine(runtime, profile, home: str) -> JuiceFSEngine:
    """The engine of JuiceFSRuntime ``runtime`` (``profile`` is None; called by
    ``datacache.stack.engines.engine_for``, which finds this module by entry point)."""
    return JuiceFSEngine(runtime, home)


def stop_runtime(runtime, home: str) -> None:
    """Stop the runtime's own JuiceFS client (keeps the cache). Never raises when none runs."""
    JuiceFSEngine(runtime, home).teardown(clean_cache=False)
