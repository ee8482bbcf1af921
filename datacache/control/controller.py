"""The long-running embedded controller (``datacache controller``): what Kubernetes controllers do
for Fluid, on one machine, over the embedded state database.

Every ``interval`` seconds one :meth:`Controller.tick`:

- syncs each Dataset whose ``spec.autoSyncInterval`` (seconds) has passed since its last sync
  (:meth:`Embedded.sync`, which also fires the OnEvent DataLoads the sync's diff touches);
- runs each Cron DataLoad and Cron DataMigrate whose schedule has come since its
  ``lastScheduleTime`` (or creation), then the steps waiting for it (``runAfter``, see
  :mod:`.flows`);
- deletes each finished DataMigrate and DataProcess whose ``ttlSecondsAfterFinished`` has passed
  since its ``completionTime``;
- evaluates each CacheRuntime's ``spec.autoscale`` with :func:`.autoscale.decide` on its workers'
  capacity and use, and scales it (:meth:`Embedded.scale`).

One resource's failure is logged and does not stop the others. Each action is logged at INFO (a
sync only when it found changes: an unchanged one is DEBUG; each DataLoad run with its result,
OnEvent ones by :meth:`Embedded.run_on_event`). Work runs in the tick's thread, one
item at a time: a long DataLoad delays the next tick, it never runs twice at once. Scale-in stops
the workers the decision names (the least hot ones, see :mod:`datacache.cluster.workerset`).
The time of the last scaling is kept in the runtime's ``status.lastScaleTime``, so a cooldown
survives a restart of the controller; how long the use has been low is kept in memory only.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable

from datacache.api.loader import load_resource_dict
from datacache.control import autoscale, dataloads, flows, flowstatus
from datacache.control.embedded import Embedded
from datacache.stack import layout, readpath
from datacache.state import iso
from datacache.errors import DatacacheError

log = logging.getLogger("datacache.controller")


class Controller:
    """Reconciles the time-driven parts of the resources in ``plane``; ``clock`` gives epoch seconds."""

    def __init__(self, plane: Embedded, clock: Callable[[], float] = time.time):
        self.plane = plane
        self.clock = clock
        self._synced: dict[tuple[str, str], float] = {}
        self._low_since: dict[tuple[str, str], float | None] = {}
        self._hits: dict[tuple[str, str, str], int] = {}
        self._stop: threading.Event | None = None  # cancels a running DataLoad when set

    def run(self, stop: threading.Event, interval: float = 1.0) -> None:
        """Tick every ``interval`` seconds until ``stop`` is set (a running DataLoad is cancelled)."""
        self._stop = stop
        while not stop.is_set():
            self.tick()
            stop.wait(interval)

    def tick(self) -> list[str]:
        """One pass over every resource; returns one line per action taken (also logged)."""
        events = []
        for kind, step in (("Dataset", self._auto_sync), ("DataLoad", self._cron), ("DataMigrate", self._cron),
                           ("DataMigrate", self._ttl), ("DataProcess", self._ttl), ("CacheRuntime", self._autoscale)):
            for doc in self.plane.state.list(kind):
                meta = doc["metadata"]
                try:
                    line = step(doc, self.clock())
                except (DatacacheError, OSError) as err:
                    line = f"{kind.lower()} {meta['namespace']}/{meta['name']}: failed: {err}"
                    log.warning("%s", line)
                    continue
                if line:
                    log.info("%s", line)
                    events.append(line)
        return events

    # -- autoSync ------------------------------------------------------------------------------------
    def _auto_sync(self, doc: dict, now: float) -> str:
        interval = doc["spec"].get("autoSyncInterval")
        if not interval:
            return ""
        ns, name = doc["metadata"]["namespace"], doc["metadata"]["name"]
        last = self._synced.get((ns, name))
        if last is None:  # after a restart: the manifest's time is the last sync's
            path = layout.manifest_path(self.plane.home, ns, name)
            last = os.path.getmtime(path) if os.path.exists(path) else 0.0
        if now - last < interval:
            return ""
        self._synced[(ns, name)] = now
        added, changed, deleted = self.plane.sync(name, ns).counts  # OnEvent runs are logged by the plane
        line = f"dataset {ns}/{name} synced: {added} added, {changed} changed, {deleted} deleted"
        if added or changed or deleted:
            return line
        log.debug("%s", line)  # every interval: only worth a line when debugging
        return ""

    # -- Cron DataLoads ------------------------------------------------------------------------------
    def _cron(self, doc: dict, now: float) -> str:
        spec, status = doc["spec"], doc.get("status") or {}
        if spec.get("policy") != "Cron":
            return ""
        if status.get("phase") == "Executing" and (doc["kind"] == "DataLoad"
                                                   or flowstatus.running_elsewhere(status) is not None):
            return ""  # a DataMigrate left Executing by a killed process is due again (it resumes)
        meta = doc["metadata"]
        if not dataloads.cron_due(spec["schedule"], status.get("lastScheduleTime"), meta.get("creationTimestamp"), now):
            return ""
        res = load_resource_dict(doc, f"state:{doc['kind']}/{meta['namespace']}/{meta['name']}")
        if res.kind == "DataMigrate":
            ok, reason = flows.run_and_follow(self.plane, res, self._stop)
            return (f"datamigrate {meta['namespace']}/{meta['name']} ran on schedule: "
                    f"{'Complete' if ok else 'Failed'}: {reason}")
        result = self.plane.run_dataload(res, cancel=self._stop)
        flows.follow(self.plane, ("DataLoad", meta["namespace"], meta["name"]), result.ok, dataloads.outcome(result),
                     self._stop)
        return f"dataload {meta['namespace']}/{meta['name']} ran on schedule: {dataloads.outcome(result)}"

    # -- ttlSecondsAfterFinished ---------------------------------------------------------------------
    def _ttl(self, doc: dict, now: float) -> str:
        ttl, status = doc["spec"].get("ttlSecondsAfterFinished"), doc.get("status") or {}
        done = status.get("completionTime")
        if ttl is None or not done or status.get("phase") not in ("Complete", "Failed", "Cancelled") \
                or dataloads.parse_iso(done) + ttl > now:
            return ""
        meta = doc["metadata"]
        return self.plane.delete(doc["kind"], meta["name"], meta["namespace"]) + \
            f" (ttlSecondsAfterFinished {ttl} s after it finished)"

    # -- autoscale -----------------------------------------------------------------------------------
    def _autoscale(self, doc: dict, now: float) -> str:
        if not (doc["spec"].get("autoscale")):
            return ""
        runtime = load_resource_dict(doc, "state:CacheRuntime")
        ns, name = runtime.metadata.namespace, runtime.metadata.name
        policy, current = runtime.spec.autoscale, runtime.spec.replicas
        metrics = self.metrics(runtime)
        self._low_since[(ns, name)] = autoscale.low_since(policy, metrics, now, self._low_since.get((ns, name)))
        last = (doc.get("status") or {}).get("lastScaleTime")
        decision = autoscale.decide(policy, current, metrics, now, dataloads.parse_iso(last) if last else None,
                                    below_since=self._low_since[(ns, name)])
        if decision.replicas == current:
            return ""
        line = self.plane.scale(name, decision.replicas, ns, decision.remove)
        status = self.plane.refresh_status("CacheRuntime", name, ns)
        status["lastScaleTime"] = iso(now)  # kept by later refreshes: cooldowns survive restarts
        self.plane.state.set_status("CacheRuntime", name, ns, status)
        self._low_since.pop((ns, name), None)
        victims = f" (stopped the least hot: {', '.join(decision.remove)})" if decision.remove else ""
        return f"{line}: {decision.reason}{victims}"

    def metrics(self, runtime) -> list[autoscale.WorkerMetrics]:
        """The ready workers' capacity and used bytes; ``hot_bytes`` is the block hits since the
        previous call × the block size (an upper bound: a file's last block is shorter). A worker
        with no earlier figure here (new, or its metrics unreadable at the previous call: a busy
        worker times out) counts every hit it has served: taken as 0, it would rank as the least
        hot and be the first stopped on scale-in."""
        ns, name = runtime.metadata.namespace, runtime.metadata.name
        if readpath.distributed(runtime):
            from datacache.cluster.status import observe_workers

            workers = [w for w in observe_workers(self.plane.home, runtime) if w["ready"]]
        else:
            store = self.plane.store_for(runtime)
            workers = [{"name": f"{name}-worker-0", "capacity": store.capacity, "used": store.used(), "hits": 0}]
            store.close()
        out = []
        for w in workers:
            before = self._hits.get((ns, name, w["name"]), 0)
            self._hits[(ns, name, w["name"])] = w["hits"]
            out.append(autoscale.WorkerMetrics(w["name"], w["capacity"], w["used"],
                                               max(w["hits"] - before, 0) * runtime.spec.block_size_bytes))
        return out
