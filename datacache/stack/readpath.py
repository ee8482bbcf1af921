"""ReadPath: a dataset's read path assembled from its stored resources.

Namespace (stored manifest) -> UFS (mounts opened by the runtime's engine) -> tiered store (the
runtime's levels, :mod:`.layout`) -> block source (in-process :class:`LocalBlockSource`, or the
runtime's cache workers) -> :class:`DatasetClient`, with this node's file tier (complete file
versions as contiguous files, :mod:`datacache.cache.filetier`). Every host that reads calls this: the
embedded control plane, ``datacache://``, the FUSE daemon and the cache worker process.

What only a control plane may do is passed in as two hooks, so that readers need none:
``ensure_workers(runtime)`` (start a distributed runtime's workers if they are not running: the
embedded supervisor) and ``sync(name, namespace)`` (list a dataset that has no manifest yet).
"""

from __future__ import annotations

import difflib
import functools
import logging
import os
import sqlite3
from typing import Callable

from datacache.api.loader import load_resource_dict
from datacache.cache.budget import MemoryBudget
from datacache.cache.disk import DiskTier
from datacache.cache.filetier import FileTier
from datacache.cache.memory import MemoryTier
from datacache.cache.local_source import LocalBlockSource
from datacache.cache.readahead import ReadAhead
from datacache.cache.stats import HitStats
from datacache.cache.tiered import TieredStore
from datacache.dataset_client import DatasetClient
from datacache.dataset_namespace import DatasetNamespace
from datacache.cluster import membership
from datacache.errors import ResourceError
from datacache.file_readahead import FileReadAhead
from datacache.manifest import Manifest
from datacache.plan.follow import PlanFollower
from datacache.scan_warmup import ScanWarmup
from datacache.stack import layout, refreshed, syncmark
from datacache.stack.engines import engine_for
from datacache.state import StateStore
from datacache.ufs.mounts import UnionNamespace
from datacache.ufs.schemes import register_profile_schemes

log = logging.getLogger(__name__)
READAHEAD_BUDGET = 256 << 20  # bytes held by read-ahead and fills in flight, per process
RUNTIME_KINDS = ("CacheRuntime", "ThinRuntime", "JuiceFSRuntime")
"""Runtime kinds a Dataset binds to, in the order :meth:`ReadPath.runtime_for` looks for them."""


def distributed(runtime) -> bool:
    """Whether ``runtime`` (a CacheRuntime model) reads through cache workers: ``replicas`` >= 2 on
    this machine, or >= 1 when the workers are external (a pod reading from the runtime's worker pods
    must not cache in its own emptyDir; see :func:`datacache.cluster.membership.external`). Raises
    ``ConfigError`` for an unknown ``DATACACHE_MEMBERSHIP``."""
    return runtime.spec.replicas >= (1 if membership.external() else 2)


class ReadPath:
    """The read paths of the datasets stored in ``state`` (a :class:`StateStore`) under ``home``.

    ``budget``: the memory budget shared by every block source this object builds (bytes held by
    read-ahead and fills in flight; default :data:`READAHEAD_BUDGET`); ``ensure_workers`` and
    ``sync``: the control plane's hooks (module docstring), or None where there is none (a worker).
    """

    def __init__(self, home: str, state: StateStore, budget: MemoryBudget | None = None, *,
                 ensure_workers: Callable | None = None, sync: Callable | None = None):
        self.home = home
        self.state = state
        self.budget = budget or MemoryBudget(READAHEAD_BUDGET)
        self._ensure_workers = ensure_workers
        self._sync = sync
        register_profile_schemes(state.list("ThinRuntimeProfile"))  # their mounts' URLs validate

    def close(self) -> None:
        """Close the state store."""
        self.state.close()

    # -- resources ---------------------------------------------------------------------------------
    def get(self, kind: str, name: str, namespace: str = "default"):
        """The resource model, or raises ResourceError naming what is missing."""
        doc = self.state.get(kind, name, namespace)
        if doc is None:
            known = [d["metadata"]["name"] for d in self.state.list(kind, namespace)]
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean {close[0]!r}? else " if close else ""
            raise ResourceError(f"{kind.lower()} {namespace}/{name} not found: {hint}apply it first "
                                f"(datacache apply -f FILE); see 'datacache get {kind.lower()}s'")
        return load_resource_dict(doc, f"state:{kind}/{namespace}/{name}")

    def runtime_for(self, dataset):
        """The runtime bound to ``dataset`` (same name and namespace, as in Fluid): its CacheRuntime,
        else its ThinRuntime, else its JuiceFSRuntime, else None."""
        for kind in RUNTIME_KINDS:
            doc = self.state.get(kind, dataset.metadata.name, dataset.metadata.namespace)
            if doc:
                return load_resource_dict(doc, "state")
        return None

    def bound(self, name: str, namespace: str = "default"):
        """``(Dataset, runtime)``, or raises ResourceError naming which one is missing (opens nothing)."""
        ds = self.get("Dataset", name, namespace)
        runtime = self.runtime_for(ds)
        if runtime is None:
            raise ResourceError(f"dataset {namespace}/{name} has no CacheRuntime: apply a CacheRuntime "
                                f"(or ThinRuntime) named {name!r} in namespace {namespace!r} to cache it")
        return ds, runtime

    def engine(self, runtime):
        """The runtime's engine (:mod:`.engines`), given a ThinRuntime's profile. Raises
        ResourceError when that profile is missing."""
        profile = None
        if runtime.kind == "ThinRuntime":
            name = runtime.spec.profile_name
            doc = self.state.get("ThinRuntimeProfile", name)
            if doc is None:
                raise ResourceError(f"thinruntime {runtime.metadata.namespace}/{runtime.metadata.name}: "
                                    f"spec.profileName: thinruntimeprofile {name!r} not found: apply it first")
            profile = load_resource_dict(doc, f"state:ThinRuntimeProfile/{name}")
        return engine_for(runtime, profile, self.home)

    # -- layers ------------------------------------------------------------------------------------
    def load_manifest(self, ds) -> Manifest | None:
        """The stored manifest of Dataset ``ds``, or None before its first sync."""
        path = layout.manifest_path(self.home, ds.metadata.namespace, ds.metadata.name)
        return Manifest.load(path) if os.path.exists(path) else None

    def synced_manifest(self, ds) -> Manifest:
        """The stored manifest of Dataset ``ds``, synced first through the ``sync`` hook when it
        was never synced. Raises ResourceError when it has none and there is no hook, and what the
        sync raises (a UFS that cannot be listed)."""
        manifest = self.load_manifest(ds)
        if manifest is None:
            name, namespace = ds.metadata.name, ds.metadata.namespace
            if self._sync is None:
                raise ResourceError(f"dataset {namespace}/{name} has no manifest yet: run 'datacache sync {name}'")
            self._sync(name, namespace)
            manifest = self.load_manifest(ds)
        return manifest

    def ufs_for(self, ds, runtime=None) -> UnionNamespace:
        """The dataset's mounts opened by its runtime (``runtime``, default the bound one): a
        ThinRuntime's plugin or FUSE directory (started if needed), else the mounts' URLs. Raises
        ResourceError when a ThinRuntime's profile is missing or its FUSE command fails."""
        runtime = runtime or self.runtime_for(ds)
        return UnionNamespace(ds, self.home, self.engine(runtime).opener(ds) if runtime else None)

    def store_for(self, runtime, worker: str | None = None, disk_tier=DiskTier) -> TieredStore:
        """The tiered store of ``runtime``'s levels: the in-process cache, or with ``worker``
        (``worker-<i>``) that worker's own cache (:mod:`.layout`); ``disk_tier`` is the DiskTier
        class to use. Raises ``OSError`` if a directory cannot be made."""
        levels = []
        for level in runtime.spec.tieredstore.ordered_levels:
            if level.mediumtype == "MEM":
                levels.append(MemoryTier(level.quota_bytes, level.high, level.low))
            else:
                levels.append(disk_tier(layout.level_dir(self.home, runtime, level, worker), level.quota_bytes,
                                        level.high, level.low, level.mediumtype, runtime.spec.block_size_bytes,
                                        level.free_space_ratio))
        return TieredStore(levels)

    def file_tier(self, runtime) -> FileTier | None:
        """``runtime``'s file tier on this node (:func:`.layout.file_tier`), or None when it is off
        or its directory cannot be used (logged: reads then go through the blocks, as the disk
        tier's own failures do)."""
        where = layout.file_tier(self.home, runtime)
        if where is None:
            return None
        spec = runtime.spec.tieredstore.file_tier
        try:
            return FileTier(where[0], where[1], spec.high, spec.low)
        except (OSError, sqlite3.Error) as err:
            log.warning("file tier %s unusable, files are read through their blocks: %s", where[0], err)
            return None

    def hit_stats(self, runtime) -> HitStats:
        """``runtime``'s hit counters (shared by every process of this home)."""
        return HitStats(layout.stats_dir(self.home, runtime))

    def block_source(self, runtime, ufs):
        """The block source: in-process, or the runtime's workers (:func:`distributed`), after
        ``ensure_workers(runtime)`` when there is that hook. Raises ResourceError when a distributed
        runtime has no worker token yet."""
        if not distributed(runtime):
            bs = runtime.spec.block_size_bytes
            return LocalBlockSource(runtime.metadata.name, self.store_for(runtime), ufs, bs,
                                    ReadAhead(self.budget, bs), self.hit_stats(runtime))
        if self._ensure_workers is not None:
            self._ensure_workers(runtime)
        from datacache.cluster import worker_source as cluster_source  # aiohttp: only for workers

        return cluster_source.connect(self.home, runtime, ufs, self.budget, self.hit_stats(runtime))

    def namespace(self, name: str, namespace: str = "default") -> DatasetNamespace:
        """The file tree of dataset ``namespace/name`` from its stored manifest, without a runtime
        (listing needs no cache; its files cannot be refreshed from the UFS). Raises ResourceError
        when the dataset is missing or was never synced."""
        ds = self.get("Dataset", name, namespace)
        manifest = self.load_manifest(ds)
        if manifest is None:
            raise ResourceError(f"dataset {namespace}/{name} has no manifest yet: run 'datacache sync {name}'")
        return DatasetNamespace(name, manifest, load_manifest=lambda: self.load_manifest(ds),
                                manifest_path=layout.manifest_path(self.home, namespace, name))

    def open_dataset(self, name: str, namespace: str = "default") -> DatasetClient:
        """A DatasetClient reading dataset ``namespace/name`` through its runtime's cache. A dataset
        never synced is synced first through the ``sync`` hook. Raises ResourceError when the
        dataset or its runtime is missing, or it has no manifest and there is no hook. Close it."""
        ds, runtime = self.bound(name, namespace)
        manifest = self.synced_manifest(ds)
        if not self.engine(runtime).reads_through_datacache:
            raise ResourceError(f"dataset {namespace}/{name} is read through its {runtime.kind}'s own client, "
                                f"not datacache's cache: mount it (datacache mount {name} DIR)")
        ufs = self.ufs_for(ds, runtime)
        source = self.block_source(runtime, ufs)
        directory = layout.dataset_dir(self.home, namespace, name)
        path = layout.manifest_path(self.home, namespace, name)

        def save(refreshed_manifest: Manifest, dataset_path: str) -> None:  # under the manifest write lock
            refreshed_manifest.save(path)
            refreshed.record(directory, dataset_path)

        names = DatasetNamespace(name, manifest, ufs, save, load_manifest=lambda: self.load_manifest(ds),
                                 manifest_path=path, manifest_lock=lambda: syncmark.manifest_write(directory))
        client = DatasetClient(names, source, readahead=runtime.spec.fuse.read_ahead_blocks,
                               files=functools.partial(self.file_tier, runtime))
        follower = PlanFollower(client, directory)
        client.on_read(follower)  # prefetch and evict by a published plan
        # without a plan: prefetch the next files of a scan in name order
        client.on_read(FileReadAhead(client, standby=lambda: bool(follower.cursors)))
        if runtime.spec.fuse.scan_warmup:  # a cold epoch over a tree: the rest of the tree loaded in parallel
            client.on_read(ScanWarmup(client, os.path.join(directory, "scan-warmup.lock"),
                                      standby=lambda: bool(follower.cursors)))
        return client
