"""The embedded host: the control plane on one machine, with no Kubernetes.

Resources live in a SQLite database under ``$DATACACHE_HOME``; a Dataset's manifest in
``datasets/<namespace>/<name>/manifest.parquet``; its cache in each tiered-store level's directory
under ``<level path>/<namespace>/<runtime name>`` (a relative level path is taken relative to
``$DATACACHE_HOME``). Applying a Dataset syncs its metadata; applying a DataLoad with policy Once
runs it. Status is recomputed from observations by ``reconcile`` whenever it is read.

The runtime bound to a Dataset (``datacache_runtimes.engine_for``) decides how its mounts are opened:
a CacheRuntime reads their URLs; a ThinRuntime goes through its profile's plugin or FUSE command,
which starts when the runtime is applied or the dataset opened, and stops when either is deleted.
An engine with a cache of its own (JuiceFSRuntime: ``reads_through_datacache`` False) also loads
DataLoads, reports the Dataset's figures and serves readers' mounts itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import shutil
import threading
import time
from datetime import datetime, timezone

from datacache import private
from datacache.api.loader import load_resource_dict, to_document
from datacache.api.models import RUNTIME_PLUGIN_GROUP, CacheRuntime, Dataset, DataLoad, ThinRuntime, plugin_schemes
from datacache.api.quantity import format_bytes
from datacache.cache.disk import DiskTier
from datacache.cache.stats import HitStats
from datacache.cache.tiered import TieredStore
from datacache.dataset_client import DatasetClient
from datacache.cluster import auth, membership
from datacache.cluster.status import observe_workers
from datacache.cluster import workerset
from datacache.control import dataloads, flowgraph, flows, observe, reconcile, supervisor
from datacache.stack import refreshed, syncmark
from datacache.control.fuse_mounts import fuse_mounts_of, lazy_unmount
from datacache.stack import layout
from datacache.stack.engines import stop_runtime
from datacache.stack.plans import traced
from datacache.stack.readpath import ReadPath, distributed
from datacache.state import StateStore, default_home, now_iso
from datacache.control.sync import sync_manifest
from datacache.warmup import close_after, warmup
from datacache.errors import DatacacheError, ResourceError, SecretNotFound, describe_error
from datacache.manifest import Manifest, ManifestDiff
from datacache.ufs.mounts import UnionNamespace

# A ThinRuntime (and its profile) goes before its Dataset: the Dataset's sync reads through it.
_APPLY_ORDER = {"ThinRuntimeProfile": -2, "ThinRuntime": -1, "JuiceFSRuntime": -1, "Dataset": 0, "CacheRuntime": 1,
                "DataLoad": 2, "DataMigrate": 2, "DataProcess": 2}
log = logging.getLogger("datacache.dataloads")


class Embedded:
    """Control plane over ``home`` (default ``$DATACACHE_HOME``)."""

    def __init__(self, home: str | None = None):
        self.home = os.path.abspath(home or default_home())
        self.state = StateStore(self.home)
        self.paths = ReadPath(self.home, self.state, ensure_workers=functools.partial(supervisor.ensure_workers,
                                                                                       self.home), sync=self.sync)

    # -- resources -------------------------------------------------------------------------------
    def apply(self, resources: list) -> list[str]:
        """Store and reconcile ``resources`` (models, already validated); returns one line per
        resource, kubectl-style (``dataset.datacache.io/demo created``). DataLoads with policy Once
        run before returning. As ``kubectl apply`` does, a document whose reconcile fails (a
        Dataset's first sync, a DataLoad's run) does not stop the others: it is stored and its
        status says why; then :class:`ApplyError` is raised with every line and every failure.
        Flow steps (DataMigrate, DataProcess, a DataLoad with runAfter) run in ``runAfter`` order
        (see :mod:`.flows`); a missing predecessor or a cycle raises ``ResourceError`` before
        anything is stored."""
        docs = [to_document(r) for r in resources]
        flowgraph.check([d for k in flowgraph.FLOW_KINDS for d in self.state.list(k)], docs)
        place = {id(d): i for i, d in enumerate(flowgraph.order(docs))}
        ranked = sorted(zip(docs, resources), key=lambda p: (_APPLY_ORDER[p[1].kind], place[id(p[0])]))
        lines, failures, causes = [], [], []
        for res in [r for _, r in ranked]:
            label = f"{res.kind.lower()}.datacache.io/{res.metadata.name}"
            try:
                lines.append(f"{label} {self._apply_one(res)}")
            except _Stored as err:  # kept, with a status saying why (phase Failed)
                lines.append(f"{label} {err.verb}")
                failures.append(f"{label}: stored, but failed: {describe_error(err.__cause__)}")
                causes.append(err.__cause__)
            except (DatacacheError, OSError) as err:
                lines.append(f"{label} not applied")
                failures.append(f"{label}: {describe_error(err)}")
                causes.append(err)
        if failures:
            raise ApplyError(lines, failures) from causes[0]
        return lines

    def _apply_one(self, res) -> str:
        """Store ``res`` and act on it; returns the verb (``created`` ...). A failure after the
        store is raised as :class:`_Stored` (its ``__cause__`` the error)."""
        doc = to_document(res)
        doc.pop("status", None)
        old = self.state.get(res.kind, res.metadata.name, res.metadata.namespace)
        self.state.put(doc)
        verb = "created" if old is None else ("unchanged" if _same_spec(old, doc) else "configured")
        try:
            if res.kind == "Dataset" and (verb != "unchanged" or self._sync_failed(res)):
                self.sync(res.metadata.name, res.metadata.namespace)
                verb = "configured" if verb == "unchanged" else verb  # a failed sync ran again, and worked
            elif res.kind == "CacheRuntime":
                verb += supervisor.converge(self.home, res)
            elif flows.is_step(res):
                flows.on_apply(self, res, verb)
            elif res.kind == "DataLoad" and res.spec.policy == "Once" and verb != "unchanged":
                key = ("DataLoad", res.metadata.namespace, res.metadata.name)
                try:
                    result = self.run_dataload(res)
                except (DatacacheError, OSError) as err:  # the steps waiting for it fail with its reason
                    flows.follow(self, key, False, describe_error(err))
                    raise
                failures = [f for t in result.targets for f in t.failures]
                flows.follow(self, key, result.ok, "; ".join(failures[:3]) or "not every target is cached")
                if not result.ok:  # its status says Failed and why; apply says so too
                    raise DatacacheError(f"its run failed: {'; '.join(failures[:3])}" if failures else
                                         f"its run failed: see 'datacache describe dataload {res.metadata.name}'")
            elif res.kind == "DataLoad" and verb == "created":  # Cron / OnEvent: the controller runs it
                self.state.set_status("DataLoad", res.metadata.name, res.metadata.namespace, {"phase": "Pending"})
            elif (res.kind in ("ThinRuntime", "JuiceFSRuntime") and verb != "unchanged"
                  and self.state.get("Dataset", res.metadata.name, res.metadata.namespace)):
                self.sync(res.metadata.name, res.metadata.namespace)  # (re)starts it, re-lists through it
        except (DatacacheError, OSError) as err:
            raise _Stored(verb) from err
        return verb

    def _sync_failed(self, ds: Dataset) -> bool:
        """Whether ``ds`` has no manifest yet or its last sync failed: applying it again retries."""
        return self.load_manifest(ds) is None or bool(syncmark.last_failure(self._dataset_dir(ds)))

    def scale(self, name: str, replicas: int, namespace: str = "default", remove: tuple[str, ...] = ()) -> str:
        """Set a CacheRuntime's ``replicas`` and wait for its workers (``datacache scale``);
        ``remove``: on scale-in, the workers to stop (``worker-<i>`` or ``<name>-worker-<i>``; by
        default the highest indexes), see :mod:`datacache.cluster.workerset`. Returns
        ``cacheruntime.datacache.io/NAME scaled`` plus a note when not all are ready, or, for
        ``replicas`` 0 or 1, that the in-process cache serves (no worker processes). Raises
        ``ValueError`` for a name in ``remove`` that is not a worker's."""
        runtime = self.get("CacheRuntime", name, namespace)
        supervisor.drain_timeout()  # a wrong $DATACACHE_DRAIN_TIMEOUT_S fails before anything changes
        current = workerset.read(self.home, namespace, name)
        if current is None and distributed(runtime):
            current = list(range(runtime.spec.replicas))
        workerset.write(self.home, namespace, name,
                        workerset.plan(replicas, current, [workerset.index_of(w) for w in remove]))
        runtime.spec.replicas = replicas
        line = self.apply([runtime])[0].replace(" configured", " scaled").replace(" unchanged", " scaled")
        line += self.paths.engine(runtime).scale(replicas)
        return line if distributed(runtime) else f"{line} (replicas {replicas}: {reconcile.IN_PROCESS_NOTE})"

    def get(self, kind: str, name: str, namespace: str = "default"):
        """The resource model, or raises ResourceError naming what is missing."""
        return self.paths.get(kind, name, namespace)

    def list(self, kind: str, namespace: str | None = None) -> list[dict]:
        """Documents of ``kind`` with their status recomputed now."""
        docs = self.state.list(kind, namespace)
        for doc in docs:
            meta = doc["metadata"]
            doc["status"] = self.refresh_status(kind, meta["name"], meta["namespace"]) or doc.get("status")
        return docs

    def delete(self, kind: str, name: str, namespace: str = "default", force: bool = False) -> str:
        """Delete a resource. Deleting a Dataset also removes its cached blocks (in-process and on
        every worker, running or not), hit counters, manifests and DataLoads; deleting a runtime
        stops its workers and removes its cache directories. Raises ResourceError
        while a FUSE mount of the dataset exists, unless ``force`` (then it is lazily unmounted), and
        when there is no such resource (already deleted)."""
        if self.state.get(kind, name, namespace) is None:
            raise ResourceError(f"{kind.lower()} {namespace}/{name} not found (already deleted?); see "
                                f"'datacache get {kind.lower()}s'")
        res = self.get(kind, name, namespace)
        if kind == "Dataset":
            runtime = self.runtime_for(res)
            self._release_mounts(namespace, name, force, runtime)
            if runtime is not None:
                engine = self._engine(runtime)
                if engine is None or engine.reads_through_datacache:
                    self._drop_blocks(runtime, name)
                    stats = self._stats(runtime)
                    stats.reset(name)
                    stats.close()
                    self._drop_stats(runtime)
                stop_runtime(runtime, self.home)
            _remove_tree(self._dataset_dir(res))
            for doc in self.state.list("DataLoad", namespace):
                if doc["spec"]["dataset"]["name"] == name:  # owned by the dataset, as in Fluid
                    self.state.delete("DataLoad", doc["metadata"]["name"], namespace)
            self.state.delete(kind, name, namespace)
            if runtime is not None:  # a runtime is its own resource, as in Fluid
                return (f"dataset.datacache.io/{name} deleted ({runtime.kind.lower()} {name} stays, with its "
                        f"workers and cache: datacache delete {runtime.kind.lower()} {name})")
            return f"dataset.datacache.io/{name} deleted"
        if kind == "CacheRuntime":
            supervisor.stop(self.home, namespace, name)
            workerset.forget(self.home, namespace, name)
            self._drop_cache_dirs(res)
            self._drop_stats(res)
            _remove_tree(auth.runtime_dir(self.home, namespace, name))  # its worker token
        elif kind == "ThinRuntime":
            stop_runtime(res, self.home)
            self._drop_cache_dirs(res)
            self._drop_stats(res)
        elif kind == "JuiceFSRuntime":
            self._release_mounts(namespace, name, force, res)
            self.paths.engine(res).teardown(clean_cache=True)  # the cache as cleanCachePolicy says
        self.state.delete(kind, name, namespace)
        return f"{kind.lower()}.datacache.io/{name} deleted"

    def _drop_stats(self, runtime) -> None:
        """Remove ``runtime``'s hit counters (``stats/<ns>/<name>``): they count its dataset's reads."""
        _remove_tree(layout.stats_dir(self.home, runtime))

    def _release_mounts(self, namespace: str, name: str, force: bool, runtime=None) -> None:
        """Refuse while dataset ``namespace``/``name`` is mounted (datacache's own FUSE mounts, and
        those ``runtime``'s engine serves itself), or with ``force`` unmount them lazily."""
        engine = self._engine(runtime) if runtime is not None else None
        mounted = fuse_mounts_of(namespace, name, self.home) + (engine.reader_mounts() if engine is not None else [])
        if mounted and not force:
            raise ResourceError(f"dataset {namespace}/{name} is mounted at {', '.join(mounted)}: unmount it first "
                                f"(datacache unmount {mounted[0]}) or delete with --force")
        for path in mounted:
            lazy_unmount(path)

    def _drop_cache_dirs(self, runtime) -> None:
        """Remove every disk level's ``<level path>/<ns>/<name>`` of ``runtime`` (in-process and
        ``worker-<i>`` caches) and its file tier: its blocks go with it, as a Fluid runtime's cache
        does."""
        for level in runtime.spec.tieredstore.levels:
            if level.path is not None:
                _remove_tree(layout.level_dir(self.home, runtime, level))
        self._drop_file_tier(runtime)

    def _drop_file_tier(self, runtime) -> None:
        """Remove ``runtime``'s file tier (its files are all of its one dataset's versions)."""
        where = layout.file_tier(self.home, runtime)
        if where is not None:
            _remove_tree(where[0])

    def _drop_blocks(self, runtime, dataset: str) -> None:
        """Delete ``dataset``'s blocks from live workers (their MEM levels too) and from every
        cache directory of ``runtime`` on disk: in-process, and each ``worker-<i>``."""
        if distributed(runtime):
            try:
                from datacache.cluster import worker_source as cluster_source  # aiohttp: only for workers

                source = cluster_source.connect(self.home, runtime, None, self.paths.budget)
            except ResourceError:
                source = None  # never started: no worker token, nothing live
            if source is not None:
                source.drop()
                source.close()
        workers = set()
        for level in runtime.spec.tieredstore.levels:
            if level.path is not None and os.path.isdir(layout.level_dir(self.home, runtime, level)):
                workers.update(e for e in os.listdir(layout.level_dir(self.home, runtime, level)) if e.startswith("worker-"))
        for worker in [None, *sorted(workers)]:
            store = self.store_for(runtime, worker)
            try:
                store.delete_prefix(f"{dataset}/")
            finally:
                store.close()
        self._drop_file_tier(runtime)

    def refresh_status(self, kind: str, name: str, namespace: str = "default") -> dict | None:
        """Recompute and store the status of one resource from observations."""
        previous = (self.state.get(kind, name, namespace) or {}).get("status") or {}
        if kind == "Dataset":
            obs, old_versions = self._observe(self.get(kind, name, namespace))
            status = reconcile.dataset_status(obs)
            if old_versions is not None:  # blocks no manifest names any more, until evicted (see README)
                status["cacheStates"]["oldVersionsCached"] = format_bytes(old_versions)
        elif kind == "JuiceFSRuntime":
            rt = self.get(kind, name, namespace)
            engine = self.paths.engine(rt)
            capacity, used = engine.usage()
            cache = {"name": f"{name}-juicefs", "ready": engine.ready(), "capacity": capacity, "used": used}
            status = reconcile.in_process_status(rt.spec.replicas, cache)
        elif kind in ("CacheRuntime", "ThinRuntime"):
            rt = self.get(kind, name, namespace)
            if distributed(rt):
                status = reconcile.runtime_status(rt.spec.replicas, observe_workers(self.home, rt),
                                                  self._runtime_problem(rt))
            else:  # replicas 0 or 1: the in-process cache, no worker processes
                store = self.store_for(rt)
                unhealthy = [{"medium": lv.medium, "path": lv.path, "reason": lv.last_error}
                             for lv in store.levels if not getattr(lv, "healthy", True)]
                cache = {"name": f"{name}-in-process", "capacity": store.capacity, "used": store.used(),
                         "ready": self._ready(rt) and len(unhealthy) < len(store.levels),  # a level can cache
                         "unhealthyTiers": unhealthy}
                store.close()
                status = reconcile.in_process_status(rt.spec.replicas, cache, self._runtime_problem(rt))
            if "lastScaleTime" in previous:  # written by the controller, not observed
                status["lastScaleTime"] = previous["lastScaleTime"]
        else:
            return None
        reconcile.keep_transition_times(status, previous)
        self.state.set_status(kind, name, namespace, status)
        return status

    # -- datasets --------------------------------------------------------------------------------
    def runtime_for(self, dataset: Dataset) -> CacheRuntime | ThinRuntime | None:
        """The runtime bound to ``dataset`` (see :meth:`ReadPath.runtime_for`)."""
        return self.paths.runtime_for(dataset)

    def sync(self, name: str, namespace: str = "default", on_progress=None) -> ManifestDiff:
        """Metadata sync: list every mount (streamed, bounded memory: see :mod:`.sync`), store a new
        manifest, return the diff to the old one; ``on_progress(files_listed)`` reports progress.
        While it runs the Dataset's phase is Updating (for every process, see :mod:`datacache.stack.syncmark`);
        a failed sync keeps the old manifest, sets phase Failed with the reason and re-raises
        (``ResourceError``/``UFSUnavailableError`` from the listing, ``OSError``)."""
        ds = self.get("Dataset", name, namespace)
        directory = private.makedirs(self._dataset_dir(ds))
        try:
            with syncmark.running(directory):
                self.refresh_status("Dataset", name, namespace)  # Updating
                try:
                    diff = sync_manifest(self.ufs_for(ds).list_files(), self._manifest_path(ds), on_progress)
                except (DatacacheError, OSError) as err:
                    syncmark.record_failure(directory, f"metadata sync failed: {err}")
                    raise
                syncmark.clear_failure(directory)
                for message in _hidden_messages(f"{namespace}/{name}", diff):
                    log.warning("%s", message)
            with syncmark.manifest_write(directory):
                extra = refreshed.take(directory)  # changes readers met first (see .refreshed)
        finally:
            self.refresh_status("Dataset", name, namespace)  # Bound, or Failed saying why
        self.run_on_event(ds, diff, extra)
        return dataclasses.replace(diff, refreshed=tuple(extra))

    def load_manifest(self, ds: Dataset) -> Manifest | None:
        return self.paths.load_manifest(ds)

    def bound(self, name: str, namespace: str = "default") -> tuple[Dataset, CacheRuntime | ThinRuntime]:
        """The Dataset and its runtime (see :meth:`ReadPath.bound`)."""
        return self.paths.bound(name, namespace)

    def open_dataset(self, name: str, namespace: str = "default") -> DatasetClient:
        """A DatasetClient reading through the dataset's runtime cache (see
        :meth:`ReadPath.open_dataset`; a dataset never synced is synced first). Close it."""
        return self.paths.open_dataset(name, namespace)

    def run_dataload(self, dataload: DataLoad, on_progress=None, cancel: threading.Event | None = None,
                     sync_first: bool = True, check: bool = False):
        """Run a DataLoad now; returns the ``WarmupResult``. Its status goes Executing (with live
        ``progress`` and per-target ``targets[].bytesDone``, written at most once a second) →
        Complete | Failed (C13: Complete means every target's current version is 100 % cached); ``lastSuccessfulTime`` survives failed runs.
        ``cancel`` set (Ctrl-C, SIGTERM) stops it within about a second: loaded blocks stay, phase Cancelled.
        ``check``: cached blocks are verified by checksum, not only by presence and size.
        Errors opening the dataset are raised after the status says Failed, and why."""
        meta = dataload.metadata
        started, t0 = now_iso(), time.monotonic()
        previous = (self.state.get("DataLoad", meta.name, meta.namespace) or {}).get("status") or {}
        kept = {k: previous[k] for k in ("lastSuccessfulTime",) if k in previous}
        self.state.set_status("DataLoad", meta.name, meta.namespace,
                              {"phase": "Executing", "lastScheduleTime": started, **kept})
        last_write = [0.0]

        def progress(p):
            now = time.monotonic()
            if now - last_write[0] >= 1.0 or p.bytes_done == p.bytes_total:
                last_write[0] = now
                self.state.set_status("DataLoad", meta.name, meta.namespace, {
                    "phase": "Executing", "lastScheduleTime": started, **kept, "progress": {
                        "filesDone": p.files_done, "filesTotal": p.files_total,
                        "bytesDone": p.bytes_done, "bytesTotal": p.bytes_total},
                    "targets": [{"path": t.path, "files": t.files_total, "bytes": t.bytes_total,
                                 "filesDone": t.files_done, "bytesDone": t.bytes_done, "phase": "Executing"}
                                for t in p.targets]})
            if on_progress is not None:
                on_progress(p)

        client = result = None
        try:
            ds = dataload.spec.dataset
            if dataload.spec.load_metadata and sync_first:
                self.sync(ds.name, ds.namespace)
            dataset, runtime = self.bound(ds.name, ds.namespace)
            targets = [t.path if t.trace is None else (t.label, [p for p, _ in traced(self.home, ds.name,
                                                                                     ds.namespace, t.trace)[1]])
                       for t in dataload.spec.target]
            paths = [p for t in targets for p in ([t] if isinstance(t, str) else t[1])]  # an engine loads paths
            result = self.paths.engine(runtime).load(dataset, paths, on_progress=progress, cancel=cancel)
            per_worker = {}
            if result is None:  # datacache's own cache: its warmup
                client = self.open_dataset(ds.name, ds.namespace)
                result = warmup(client, targets, on_progress=progress, cancel=cancel, check=check)
                per_worker = client.source.worker_progress()
        except BaseException as err:  # never left Executing: Failed, saying why
            reason = "Cancelled" if isinstance(err, KeyboardInterrupt) else "LoadFailed"
            self.state.set_status("DataLoad", meta.name, meta.namespace, {
                "phase": "Cancelled" if reason == "Cancelled" else "Failed", "lastScheduleTime": started, **kept,
                "duration": f"{time.monotonic() - t0:.1f}s",
                "conditions": [{"type": "Complete", "status": "False", "reason": reason,
                                "message": str(err) or type(err).__name__, "lastTransitionTime": now_iso()}]})
            raise
        finally:
            if client is not None:
                close_after(client, result)  # after the fills a cancel abandoned
        status = reconcile.dataload_status(result, started)
        status = {**kept, **status}
        if per_worker:
            status["workers"] = per_worker
        self.state.set_status("DataLoad", meta.name, meta.namespace, status)
        return result

    def warmup(self, name: str, paths: list[str], namespace: str = "default", on_progress=None,
               cancel: threading.Event | None = None, check: bool = False, trace: str | None = None):
        """``datacache warmup``: a one-shot DataLoad named ``<dataset>-warmup-<UTC time>``, labelled
        ``datacache.io/warmup``; the oldest such records beyond ``WARMUP_HISTORY`` are deleted.
        ``trace``: also load the files of that recorded run ('': the last one), in its order.
        Returns ``(dataload name, WarmupResult)``. Raises ResourceError for a missing trace."""
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-%f")
        dl_name = f"{name[:30]}-warmup-{stamp}"
        doc = {"apiVersion": "datacache.io/v1alpha1", "kind": "DataLoad",
               "metadata": {"name": dl_name, "namespace": namespace, "labels": {dataloads.WARMUP_LABEL: name}},
               "spec": {"dataset": {"name": name, "namespace": namespace},
                        "target": [{"path": "/" + p.lstrip("/")} for p in paths]}}
        self.get("Dataset", name, namespace)
        if trace is not None:  # named now, so the record says which run ('' is the last)
            doc["spec"]["target"].append({"trace": traced(self.home, name, namespace, trace or None)[0]})
        dataload = load_resource_dict(doc, "datacache warmup")
        self.state.put(to_document(dataload))
        for old in dataloads.stale_warmups(self.state.list("DataLoad", namespace), name):
            self.state.delete("DataLoad", old, namespace)
        return dl_name, self.run_dataload(dataload, on_progress, cancel, check=check)

    def run_on_event(self, ds: Dataset, diff: ManifestDiff, refreshed_paths=()) -> list[str]:
        """Run the OnEvent DataLoads of ``ds`` whose targets hold files that ``diff`` (a metadata
        sync's) added or changed, or that readers refreshed since the last sync
        (``refreshed_paths``, see :mod:`datacache.stack.refreshed`); returns their names. A failed run is in its
        status, not raised."""
        fired = []
        manifest = None
        for doc in self.state.list("DataLoad", ds.metadata.namespace):
            spec = doc["spec"]
            if spec.get("policy") != "OnEvent" or spec["dataset"]["name"] != ds.metadata.name:
                continue
            dataload = load_resource_dict(doc, f"state:DataLoad/{ds.metadata.namespace}/{doc['metadata']['name']}")
            manifest = manifest or self.load_manifest(ds)
            changed = manifest and dataloads.touched([t.path for t in dataload.spec.target if t.path], manifest, diff,
                                                     refreshed_paths)
            if not changed:
                continue
            what = f"dataload {ds.metadata.namespace}/{dataload.metadata.name} ran on event ({len(changed)} files " \
                   "added or changed under its targets)"
            try:
                result = self.run_dataload(dataload, sync_first=False)  # the sync that fired it just ran
            except (DatacacheError, OSError) as err:  # also recorded as Failed in the DataLoad's status
                log.warning("%s: Failed: %s", what, describe_error(err))
            else:
                log.info("%s: %s", what, dataloads.outcome(result))
            fired.append(dataload.metadata.name)
        return fired

    # -- internals -------------------------------------------------------------------------------
    def _observe(self, ds: Dataset) -> tuple[reconcile.DatasetObservation, int | None]:
        """The dataset's figures from the manifest and one scan of the stores' indexes (see
        :mod:`.observe`), and the bytes of its blocks of versions the manifest no longer names
        (None when unknown); opens no UFS, so it needs no credentials."""
        runtime = self.runtime_for(ds)
        manifest = self.load_manifest(ds)
        directory = self._dataset_dir(ds)
        known = dict(bound=runtime is not None, synced=manifest is not None,
                     updating=syncmark.is_running(directory), sync_error=syncmark.last_failure(directory),
                     file_num=manifest.file_num if manifest else 0,
                     ufs_total=manifest.total_size if manifest else 0)
        if runtime is None:
            return reconcile.DatasetObservation(**known), None
        engine = self._engine(runtime)
        if engine is not None and not engine.reads_through_datacache:
            return self._reported(engine, ds, known), None
        name = ds.metadata.name
        held: set[str] = set()
        capacity = stored = 0
        try:
            for store in self._stores(runtime):
                try:
                    if manifest is not None:
                        held.update(observe.store_keys(store))
                        stored += observe.stored_bytes(store, f"{name}/")
                    capacity += store.capacity
                finally:
                    store.close()
        except OSError as err:  # a cache directory that cannot be opened
            return reconcile.DatasetObservation(**known, error=f"cache unreadable: {err}"), None
        if manifest is None:  # never synced (or its first sync failed): the runtime's capacity still shows
            return reconcile.DatasetObservation(**known, capacity=capacity), None
        stats = self._stats(runtime)
        try:
            hits, misses = stats.get(name)
            remote = stats.remote_hits(name)
        finally:
            stats.close()
        cached = observe.cached_bytes(manifest, held, name, runtime.spec.block_size_bytes)
        trace = observe.trace_cached(manifest, held, name, runtime.spec.block_size_bytes, self._last_trace(ds))
        return reconcile.DatasetObservation(**known, cached=cached, capacity=capacity, hits=hits, misses=misses,
                                            remote_hits=remote, trace=trace), max(stored - cached, 0)

    def _last_trace(self, ds: Dataset) -> list[str] | None:
        """The paths the dataset's last recorded run read, or None when none was recorded."""
        try:
            return [p for p, _ in traced(self.home, ds.metadata.name, ds.metadata.namespace)[1]]
        except ResourceError:
            return None

    @staticmethod
    def _reported(engine, ds: Dataset, known: dict) -> reconcile.DatasetObservation:
        """The observation from what ``engine`` counts itself (files, bytes, cached, capacity); while
        a sync runs, the manifest's figures (the engine is busy listing); while the engine is not
        ready, why (its figures need it running)."""
        if known["updating"]:
            return reconcile.DatasetObservation(**known)
        state = engine.state()
        if not state.ready:  # its client starts on sync, load or read, not on a status read
            return reconcile.DatasetObservation(**known, not_ready=state.reason)
        try:
            rep = engine.report(ds)
        except SecretNotFound as err:  # this shell lacks them: not the dataset's failure
            return reconcile.DatasetObservation(**known, not_ready=f"its figures need the dataset's secrets: {err}")
        except (DatacacheError, OSError, ValueError) as err:
            return reconcile.DatasetObservation(**known, error=f"cache unreadable: {describe_error(err)}")
        known.update(file_num=rep.files, ufs_total=rep.ufs_total)
        return reconcile.DatasetObservation(**known, cached=rep.cached, capacity=rep.capacity,
                                            cached_percentage=rep.cached_percentage)

    def _engine(self, runtime):
        """``runtime``'s engine, or None when it cannot be built (a ThinRuntime's profile is gone)."""
        try:
            return self.paths.engine(runtime)
        except ResourceError:
            return None

    def _stores(self, runtime):
        """The stores holding ``runtime``'s blocks now: its in-process store, or each ready
        worker's own store (a worker that does not answer serves nothing, so its blocks do not count;
        a draining worker's blocks count once handed off to their new owners).
        External workers' stores are on their own pods' disks, not here: none."""
        if not distributed(runtime):
            yield self.store_for(runtime)
            return
        if membership.external():
            return
        for w in observe_workers(self.home, runtime):
            if w["ready"]:
                yield self.store_for(runtime, worker="worker-" + w["name"].rsplit("-", 1)[1])

    def ufs_for(self, ds: Dataset, runtime=None) -> UnionNamespace:
        """The dataset's mounts opened by its runtime (see :meth:`ReadPath.ufs_for`)."""
        return self.paths.ufs_for(ds, runtime)

    def _ready(self, runtime) -> bool:
        try:
            return not self._runtime_problem(runtime) and self.paths.engine(runtime).ready()
        except ResourceError:
            return False

    def _runtime_problem(self, runtime) -> str:
        """Why ``runtime`` cannot work at all ('' when it can): a ThinRuntime's missing profile, or
        a profile plugin that is not installed."""
        if runtime.kind != "ThinRuntime":
            return ""
        try:
            plugin = self.paths.engine(runtime).profile.spec.plugin
        except ResourceError as err:
            return str(err)
        if plugin is not None and plugin not in plugin_schemes():
            return (f"thinruntime {runtime.metadata.namespace}/{runtime.metadata.name}: plugin {plugin!r} is not "
                    f"installed (no entry point in group {RUNTIME_PLUGIN_GROUP!r}): pip install it")
        return ""

    def store_for(self, runtime: CacheRuntime, worker: str | None = None, disk_tier=DiskTier) -> TieredStore:
        """The tiered store of ``runtime``'s levels (see :meth:`ReadPath.store_for`)."""
        return self.paths.store_for(runtime, worker, disk_tier)

    def _stats(self, runtime: CacheRuntime) -> HitStats:
        return self.paths.hit_stats(runtime)

    def _dataset_dir(self, ds: Dataset) -> str:
        return layout.dataset_dir(self.home, ds.metadata.namespace, ds.metadata.name)

    def _manifest_path(self, ds: Dataset) -> str:
        return layout.manifest_path(self.home, ds.metadata.namespace, ds.metadata.name)

    def close(self) -> None:
        self.state.close()


def read_path(home: str | None = None) -> ReadPath:
    """A :class:`ReadPath` for readers of the embedded host at ``home`` (default
    ``$DATACACHE_HOME``): ``datacache://`` and the FUSE daemon. Its hooks start a runtime's
    workers again when they are not running, and sync a dataset never synced (with a plane made
    for that call only). Close it when done."""
    home = os.path.abspath(home or default_home())

    def sync(name: str, namespace: str) -> None:
        plane = Embedded(home)
        try:
            plane.sync(name, namespace)
        finally:
            plane.close()

    return ReadPath(home, StateStore(home), ensure_workers=functools.partial(supervisor.ensure_workers, home),
                    sync=sync)


class ApplyError(ResourceError):
    """``apply`` stored what it could and some documents failed: ``lines`` says what happened to
    each document (``created``/``configured``/``unchanged``, or ``not applied``), ``failures``
    (one line each) why the failed ones failed. A ``ResourceError``: the message holds each
    failure's own, after the document's name; ``__cause__`` is the first failure's exception."""

    def __init__(self, lines: list[str], failures: list[str]):
        super().__init__("; ".join(failures))
        self.lines, self.failures = lines, failures


class _Stored(DatacacheError):
    """A document stored as ``verb`` whose reconcile then failed (the cause)."""

    def __init__(self, verb: str):
        super().__init__(verb)
        self.verb = verb


def _same_spec(old: dict, new: dict) -> bool:
    return old.get("spec") == new.get("spec") and old["metadata"].get("labels") == new["metadata"].get("labels")


def _hidden_messages(dataset: str, diff: ManifestDiff, shown_at_most: int = 5) -> list[str]:
    """What a sync left out of the listing (naming the first ``shown_at_most`` dataset paths), and
    how to reach it: files shadowed by a directory of the same path, files dropped for a later
    one with the same path, symbolic links (not followed)."""
    def shown(paths: tuple[str, ...], n: int) -> str:
        return ", ".join(paths[:shown_at_most]) + (", ..." if n > shown_at_most else "")

    messages = []
    if n := diff.shadowed:
        files, objects, them = ("file", "object", "it") if n == 1 else ("files", "objects", "them")
        messages.append(f"dataset {dataset}: {n} {files} hidden by a directory of the same name (the directory "
                        f"wins, as in Mountpoint for Amazon S3): {shown(diff.shadowed_paths, n)}; rename the "
                        f"{objects} in the UFS to read {them}")
    if n := diff.duplicates:
        files = "file" if n == 1 else "files"
        messages.append(f"dataset {dataset}: {n} {files} hidden by another whose name normalises to the same "
                        f"dataset path (object keys like a//b and a/b; the one listed last is kept): "
                        f"{shown(diff.duplicate_paths, len(diff.duplicate_paths))}")
    if n := diff.links:
        links, targets, them = ("symbolic link", "its target", "it") if n == 1 else ("symbolic links", "their targets",
                                                                                  "them")
        messages.append(f"dataset {dataset}: {n} {links} skipped (links are not followed, whether valid, dangling, "
                        f"looping or leading out of the mount): {shown(diff.link_paths, n)}; to read {targets}, "
                        f"copy {them} into the source or add the directory holding {them} as another mount")
    return messages


def _remove_tree(path: str) -> None:
    """Remove the directory tree ``path`` (``<root>/<namespace>/<name>`` of a deleted resource) and
    then its namespace directory once nothing else is in it; what cannot be removed stays."""
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):  # another resource's directory is still there
        os.rmdir(os.path.dirname(path))
