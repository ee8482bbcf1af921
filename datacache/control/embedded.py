"""The embedded host: the control plane on one machine, with no Kubernetes.

Resources live in a SQLite database under ``$DATACACHE_HOME``; a Dataset's manifest in
``datasets/<namespace>/<name>/manifest.parquet``; its cache in each tiered-store level's directory
under ``<level path>/<namespace>/<runtime name>`` (a relative level path is taken relative to
``$DATACACHE_HOME``). Applying a Dataset syncs its metadata; applying a DataLoad with policy Once
runs it. Status is recomputed from observations by ``reconcile`` whenever it is read.
"""

from __future__ import annotations

import os
import shutil
from datetime import datetime, timezone

from datacache import private
from datacache.api.loader import load_resource_dict, to_document
from datacache.api.models import CacheRuntime, Dataset, DataLoad
from datacache.cache.budget import MemoryBudget
from datacache.cache.disk import DiskTier
from datacache.cache.memory import MemoryTier
from datacache.cache.source import LocalBlockSource
from datacache.cache.stats import HitStats
from datacache.cache.tiered import TieredStore
from datacache.client import DatasetClient
from datacache.control import reconcile
from datacache.control.state import StateStore, default_home, now_iso
from datacache.dataload import warmup
from datacache.errors import ResourceError
from datacache.manifest import Manifest, ManifestDiff
from datacache.ufs.mounts import UnionNamespace

_APPLY_ORDER = {"Dataset": 0, "CacheRuntime": 1, "DataLoad": 2}
READAHEAD_BUDGET = 256 << 20  # bytes held by read-ahead and fills in flight, per process


class Embedded:
    """Control plane over ``home`` (default ``$DATACACHE_HOME``)."""

    def __init__(self, home: str | None = None):
        self.home = os.path.abspath(home or default_home())
        self.state = StateStore(self.home)
        self._budget = MemoryBudget(READAHEAD_BUDGET)

    # -- resources -------------------------------------------------------------------------------
    def apply(self, resources: list) -> list[str]:
        """Store and reconcile ``resources`` (models); returns one line per resource, kubectl-style
        (``dataset.datacache.io/demo created``). DataLoads with policy Once run before returning."""
        lines = []
        for res in sorted(resources, key=lambda r: _APPLY_ORDER[r.kind]):
            doc = to_document(res)
            doc.pop("status", None)
            old = self.state.get(res.kind, res.metadata.name, res.metadata.namespace)
            self.state.put(doc)
            verb = "created" if old is None else ("unchanged" if _same_spec(old, doc) else "configured")
            lines.append(f"{res.kind.lower()}.datacache.io/{res.metadata.name} {verb}")
            if res.kind == "Dataset" and (verb != "unchanged" or self.load_manifest(res) is None):
                self.sync(res.metadata.name, res.metadata.namespace)
            elif res.kind == "DataLoad" and res.spec.policy == "Once" and verb != "unchanged":
                self.run_dataload(res)
        return lines

    def get(self, kind: str, name: str, namespace: str = "default"):
        """The resource model, or raises ResourceError naming what is missing."""
        doc = self.state.get(kind, name, namespace)
        if doc is None:
            raise ResourceError(f"{kind.lower()} {namespace}/{name} not found: apply it first "
                                f"(datacache apply -f FILE); see 'datacache get {kind.lower()}s'")
        return load_resource_dict(doc, f"state:{kind}/{namespace}/{name}")

    def list(self, kind: str, namespace: str | None = None) -> list[dict]:
        """Documents of ``kind`` with their status recomputed now."""
        docs = self.state.list(kind, namespace)
        for doc in docs:
            meta = doc["metadata"]
            doc["status"] = self.refresh_status(kind, meta["name"], meta["namespace"]) or doc.get("status")
        return docs

    def delete(self, kind: str, name: str, namespace: str = "default") -> str:
        """Delete a resource. Deleting a Dataset also removes its manifest and cached blocks."""
        res = self.get(kind, name, namespace)
        if kind == "Dataset":
            runtime = self.runtime_for(res)
            if runtime is not None:
                store = self.store_for(runtime)
                store.delete_prefix(f"{name}/")
                store.close()
            shutil.rmtree(self._dataset_dir(res), ignore_errors=True)
        self.state.delete(kind, name, namespace)
        return f"{kind.lower()}.datacache.io/{name} deleted"

    def refresh_status(self, kind: str, name: str, namespace: str = "default") -> dict | None:
        """Recompute and store the status of one resource from observations."""
        if kind == "Dataset":
            status = reconcile.dataset_status(self._observe(self.get(kind, name, namespace)))
        elif kind == "CacheRuntime":
            rt = self.get(kind, name, namespace)
            store = self.store_for(rt)
            worker = {"name": f"{name}-worker-0", "ready": True, "capacity": store.capacity, "used": store.used()}
            store.close()
            status = reconcile.runtime_status(rt.spec.replicas, [worker] if rt.spec.replicas else [])
        else:
            return None
        self.state.set_status(kind, name, namespace, status)
        return status

    # -- datasets --------------------------------------------------------------------------------
    def runtime_for(self, dataset: Dataset) -> CacheRuntime | None:
        """The CacheRuntime bound to ``dataset`` (same name and namespace, as in Fluid)."""
        doc = self.state.get("CacheRuntime", dataset.metadata.name, dataset.metadata.namespace)
        return load_resource_dict(doc, "state") if doc else None

    def sync(self, name: str, namespace: str = "default") -> ManifestDiff:
        """Metadata sync: list every mount, store a new manifest, return the diff to the old one."""
        ds = self.get("Dataset", name, namespace)
        ufs = UnionNamespace(ds, self.home)
        new = Manifest.from_entries(ufs.list_files())
        old = self.load_manifest(ds)
        private.makedirs(self._dataset_dir(ds))
        new.save(self._manifest_path(ds))
        self.refresh_status("Dataset", name, namespace)
        return (old or Manifest.from_entries([])).diff(new)

    def load_manifest(self, ds: Dataset) -> Manifest | None:
        path = self._manifest_path(ds)
        return Manifest.load(path) if os.path.exists(path) else None

    def open_dataset(self, name: str, namespace: str = "default") -> DatasetClient:
        """A DatasetClient reading through the dataset's runtime cache. Raises ResourceError when
        the dataset or its runtime is missing. Close it when done."""
        ds = self.get("Dataset", name, namespace)
        runtime = self.runtime_for(ds)
        if runtime is None:
            raise ResourceError(f"dataset {namespace}/{name} has no CacheRuntime: apply a CacheRuntime "
                                f"named {name!r} in namespace {namespace!r} to cache it")
        manifest = self.load_manifest(ds)
        if manifest is None:
            self.sync(name, namespace)
            manifest = self.load_manifest(ds)
        ufs = UnionNamespace(ds, self.home)
        source = LocalBlockSource(name, self.store_for(runtime), ufs, runtime.spec.block_size_bytes,
                                  self._budget, self._stats(runtime))
        return DatasetClient(name, manifest, source, ufs, lambda m: m.save(self._manifest_path(ds)),
                             readahead=runtime.spec.fuse.read_ahead_blocks, load_manifest=lambda: self.load_manifest(ds))

    def run_dataload(self, dataload: DataLoad, on_progress=None):
        """Run a DataLoad now and store its status; returns the ``WarmupResult``."""
        meta = dataload.metadata
        started = now_iso()
        self.state.set_status("DataLoad", meta.name, meta.namespace, {"phase": "Executing", "lastScheduleTime": started})
        client = self.open_dataset(dataload.spec.dataset.name, dataload.spec.dataset.namespace)
        try:
            if dataload.spec.load_metadata:
                self.sync(client.name, dataload.spec.dataset.namespace)
                client.close()
                client = self.open_dataset(dataload.spec.dataset.name, dataload.spec.dataset.namespace)
            result = warmup(client, [t.path for t in dataload.spec.target], on_progress=on_progress)
        finally:
            client.close()
        self.state.set_status("DataLoad", meta.name, meta.namespace, reconcile.dataload_status(result, started))
        return result

    def warmup(self, name: str, paths: list[str], namespace: str = "default", on_progress=None):
        """``datacache warmup``: a one-shot DataLoad named ``<dataset>-warmup-<UTC time>``.
        Returns ``(dataload name, WarmupResult)``."""
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-%f")
        dl_name = f"{name[:30]}-warmup-{stamp}"
        doc = {"apiVersion": "datacache.io/v1alpha1", "kind": "DataLoad",
               "metadata": {"name": dl_name, "namespace": namespace},
               "spec": {"dataset": {"name": name, "namespace": namespace},
                        "target": [{"path": "/" + p.lstrip("/")} for p in paths]}}
        dataload = load_resource_dict(doc, "datacache warmup")
        self.get("Dataset", name, namespace)
        self.state.put(to_document(dataload))
        return dl_name, self.run_dataload(dataload, on_progress)

    # -- internals -------------------------------------------------------------------------------
    def _observe(self, ds: Dataset) -> reconcile.DatasetObservation:
        runtime = self.runtime_for(ds)
        manifest = self.load_manifest(ds)
        if runtime is None or manifest is None:
            return reconcile.DatasetObservation(
                bound=runtime is not None, synced=manifest is not None,
                file_num=manifest.file_num if manifest else 0, ufs_total=manifest.total_size if manifest else 0)
        client = self.open_dataset(ds.metadata.name, ds.metadata.namespace)
        try:
            hits, misses = client.source.hit_counts()
            return reconcile.DatasetObservation(
                bound=True, synced=True, file_num=manifest.file_num, ufs_total=manifest.total_size,
                cached=client.cached_bytes(), capacity=client.usage()[1], hits=hits, misses=misses)
        finally:
            client.close()

    def _level_dir(self, runtime: CacheRuntime, level, worker: str | None = None) -> str:
        base = os.path.join(self.home, os.path.expanduser(level.path))
        path = os.path.join(base, runtime.metadata.namespace, runtime.metadata.name)
        return os.path.join(path, worker) if worker else path

    def store_for(self, runtime: CacheRuntime, worker: str | None = None, disk_tier=DiskTier) -> TieredStore:
        """The tiered store of ``runtime``'s levels: the in-process cache, or with ``worker``
        (``worker-<i>``) that worker's own cache under ``<level path>/<ns>/<name>/<worker>``;
        ``disk_tier`` is the DiskTier class to use. Raises ``OSError`` if a directory cannot be made."""
        levels = []
        for level in runtime.spec.tieredstore.ordered_levels:
            if level.mediumtype == "MEM":
                levels.append(MemoryTier(level.quota_bytes, level.high, level.low))
            else:
                levels.append(disk_tier(self._level_dir(runtime, level, worker), level.quota_bytes, level.high,
                                        level.low, level.mediumtype))
        return TieredStore(levels)

    def _stats(self, runtime: CacheRuntime) -> HitStats:
        return HitStats(os.path.join(self.home, "stats", runtime.metadata.namespace, runtime.metadata.name))

    def _dataset_dir(self, ds: Dataset) -> str:
        return os.path.join(self.home, "datasets", ds.metadata.namespace, ds.metadata.name)

    def _manifest_path(self, ds: Dataset) -> str:
        return os.path.join(self._dataset_dir(ds), "manifest.parquet")

    def close(self) -> None:
        self.state.close()


def _same_spec(old: dict, new: dict) -> bool:
    return old.get("spec") == new.get("spec") and old["metadata"].get("labels") == new["metadata"].get("labels")

