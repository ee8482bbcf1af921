"""kopf handlers of data flows: DataMigrate and DataProcess Jobs (:mod:`.flowjobs`), started in
``runAfter`` order, with status from their Jobs; :func:`gate` also holds back a DataLoad whose
``runAfter`` has not completed.

A step whose predecessor is Pending or Executing (or not created yet) is Pending with the reason
and looked at again every ``retry_s``; when the predecessor fails the step is Failed with reason
``PredecessorFailed`` and its predecessor's message, and no Job is created; a cycle is a
PermanentError naming it. A DataMigrate into a Dataset has that Dataset synced again when it
completes (:func:`resync`). :func:`register` adds the handlers to kopf's current registry (the
handlers module calls it, so a fresh registry gets them too).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Callable

import kopf
from lightkube import AsyncClient

from datacache.api.crds import GROUP, PLURALS, VERSION
from datacache.api.dataflow import FLOW_KINDS
from datacache.control import flowgraph, flowstatus
from datacache.errors import ResourceError

from . import flowjobs, kube, manifests, syncjob
from .settings import Settings

MAX_CHAIN = 100
"""Steps followed back through runAfter when looking for a cycle."""


def _who(kind: str, namespace: str, name: str) -> str:
    return f"{kind.lower()} {namespace}/{name}"


async def gate(client: AsyncClient, res: Any, patch: kopf.Patch, retry_s: float) -> bool:
    """Whether ``res`` may start: it has no ``runAfter``, or its predecessor is Complete. When the
    predecessor failed, writes Failed (PredecessorFailed) and returns False; while it is not done
    (or not found), writes Pending with the reason and raises ``kopf.TemporaryError``; a cycle
    raises ``kopf.PermanentError``."""
    after = res.spec.run_after
    if after is None:
        return True
    me = (res.kind, res.metadata.namespace, res.metadata.name)
    namespace = after.namespace or res.metadata.namespace
    before = _who(after.kind, namespace, after.name)
    parent = await kube.get_or_none(client, after.kind, after.name, namespace)
    if parent is None:
        message = f"runAfter: {before} not found: apply it, or fix spec.runAfter"
        patch.status.update({**flowstatus.waiting(before), "conditions": [{
            **flowstatus.waiting(before)["conditions"][0], "reason": "PredecessorNotFound", "message": message}]})
        raise kopf.TemporaryError(f"{_who(*me)}: {message}", delay=retry_s)
    await _refuse_cycle(client, me, parent)
    status = parent.get("status") or {}
    phase = status.get("phase") or "Pending"
    if phase in ("Failed", "Cancelled"):
        patch.status.update(flowstatus.predecessor_failed(before, flowstatus.reason_of(status) or phase))
        return False
    if phase != "Complete":
        patch.status.update(flowstatus.waiting(before))
        raise kopf.TemporaryError(f"{_who(*me)}: waits for {before} ({phase})", delay=retry_s)
    return True


async def _refuse_cycle(client: AsyncClient, me: tuple[str, str, str], parent: dict[str, Any]) -> None:
    chain = [me]
    node = parent
    for _ in range(MAX_CHAIN):
        key = (node["kind"], node["metadata"].get("namespace", me[1]), node["metadata"]["name"])
        chain.append(key)
        if key == me:
            path = " -> ".join(_who(*k) for k in chain)
            raise kopf.PermanentError(f"{_who(*me)}: spec.runAfter makes a cycle ({path}): a flow must have a first "
                                      "step; remove runAfter from one of them")
        after = (node.get("spec") or {}).get("runAfter")
        if not after:
            return
        node = await kube.get_or_none(client, after["kind"], after["name"], after.get("namespace") or key[1])
        if node is None:
            return


def _seconds(start: str | None, end: str | None) -> str | None:
    if not start or not end:
        return None
    parse = lambda t: datetime.strptime(t, "%Y-%m-%dT%H:%M:%SZ")  # noqa: E731
    return f"{(parse(end) - parse(start)).total_seconds():.1f}s"


def job_status(job: dict[str, Any] | None) -> dict[str, Any]:
    """A flow step's status from its Job: phase, duration, completion time, and the Job's
    failure condition as the reason."""
    status = (job or {}).get("status") or {}
    phase = manifests.job_phase(status)
    out: dict[str, Any] = {"phase": phase}
    if status.get("startTime"):
        out["lastScheduleTime"] = status["startTime"]
    if phase in ("Complete", "Failed"):
        end = status.get("completionTime") or next(
            (c.get("lastTransitionTime") for c in status.get("conditions") or [] if c.get("type") == "Failed"), None)
        out["duration"] = _seconds(status.get("startTime"), end)
        out["completionTime"] = end
        failed = next((c for c in status.get("conditions") or [] if c.get("type") == "Failed"), {})
        out["conditions"] = [{"type": "Complete", "status": "True" if phase == "Complete" else "False",
                              "reason": failed.get("reason") or phase,
                              "message": failed.get("message") or ("" if phase == "Complete" else "the Job failed"),
                              "lastTransitionTime": end}]
    return {k: v for k, v in out.items() if v is not None}


async def resync(client: AsyncClient, dataset: Any) -> None:
    """Have ``dataset`` synced again after files were copied into its UFS: its finished sync Job
    is deleted, so its next reconcile (within ``status_interval_s``) starts a new one. A sync
    still running is left alone."""
    name, namespace = syncjob.names(dataset)["job"], dataset.metadata.namespace
    job = await kube.get_or_none(client, "Job", name, namespace)
    if job is not None and manifests.job_phase(job.get("status")) in ("Complete", "Failed"):
        await kube.delete(client, "Job", name, namespace)


RUN_AFTER_WEBHOOK = "flow-run-after"
"""Id (and URL path) of the validating webhook refusing a missing predecessor or a cycle."""


async def check_run_after(body: Any, namespace: str | None = None, **_: Any) -> None:
    """Admission: refuse a DataLoad, DataMigrate or DataProcess whose ``runAfter`` names a step
    that does not exist in the cluster, or closes a cycle (the same check and message as embedded
    apply, :func:`datacache.control.flowgraph.check`). Raises ``kopf.AdmissionError`` (HTTP 400)."""
    doc = {"kind": body.get("kind"), "metadata": dict(body.get("metadata") or {}), "spec": body.get("spec") or {}}
    if not doc["spec"].get("runAfter"):
        return
    doc["metadata"].setdefault("namespace", namespace or "default")
    client = AsyncClient()
    try:
        stored = [d for kind in FLOW_KINDS for d in await kube.list_dicts(client, kind, doc["metadata"]["namespace"])]
    finally:
        await client.close()
    try:
        flowgraph.check(stored, [doc])
    except ResourceError as err:
        raise kopf.AdmissionError(str(err), code=400) from None


def register(reconciled: Callable[[str, str], Any], load: Callable[[Any], Any], settings: Settings) -> None:
    """Add the DataMigrate and DataProcess handlers to kopf's current default registry;
    ``reconciled(plural, timer_id)`` gives the decorators (create, update, resume, timer) and
    ``load(body)`` the model (PermanentError for a wrong spec). Also the validating webhook
    :data:`RUN_AFTER_WEBHOOK` for the three flow kinds."""
    for kind in FLOW_KINDS:
        kopf.on.validate(GROUP, VERSION, PLURALS[kind], operations={"CREATE", "UPDATE"},
                         id=RUN_AFTER_WEBHOOK)(check_run_after)

    async def dataset_of(client: AsyncClient, ref: Any, namespace: str) -> Any:
        found = await kube.get_or_none(client, "Dataset", ref.name, ref.namespace or namespace)
        if found is None:
            raise kopf.TemporaryError(f"Dataset {ref.namespace or namespace}/{ref.name} not found yet",
                                      delay=settings.retry_s)
        return load(found)

    async def follow(client: AsyncClient, job: dict[str, Any], patch: kopf.Patch) -> dict[str, Any] | None:
        meta = job["metadata"]
        await kube.ensure(client, job, replace=job["kind"] == "CronJob")  # a Job's template is immutable
        observed = await kube.get_or_none(client, job["kind"], meta["name"], meta["namespace"])
        if job["kind"] == "CronJob":
            patch.status.update(manifests.cron_status((observed or {}).get("status")))
            return None
        patch.status.update(job_status(observed))
        return observed

    @reconciled("datamigrates", "datamigrate_status")
    async def datamigrate_changed(body: Any, patch: kopf.Patch, **_: Any) -> None:
        """Start the DataMigrate's Job once its runAfter completed, then follow it."""
        dm = load(body)
        client = AsyncClient()
        try:
            if not await gate(client, dm, patch, settings.retry_s):
                return
            dataset = await dataset_of(client, dm.spec.dataset_side, dm.metadata.namespace)
            await kube.ensure(client, flowjobs.migrate_config_map(dm, dataset, body))
            observed = await follow(client, flowjobs.migrate_job(dm, dataset, body, settings), patch)
            was = (body.get("status") or {}).get("phase")
            if dm.spec.into_dataset and patch.status.get("phase") == "Complete" and was != "Complete":
                await resync(client, dataset)
        finally:
            await client.close()
        if observed is not None and patch.status.get("phase") in ("Pending", "Executing"):
            raise kopf.TemporaryError(f"DataMigrate Job {observed['metadata']['name']} is running",
                                      delay=settings.retry_s)

    @reconciled("dataprocesses", "dataprocess_status")
    async def dataprocess_changed(body: Any, patch: kopf.Patch, **_: Any) -> None:
        """Start the DataProcess's Job once its runAfter completed, then follow it: exit code and
        the log's last lines come from its pod."""
        dp = load(body)
        client = AsyncClient()
        try:
            if not await gate(client, dp, patch, settings.retry_s):
                return
            await dataset_of(client, dp.spec.dataset, dp.metadata.namespace)
            job = flowjobs.process_job(dp, body, settings)
            observed = await follow(client, job, patch)
            if observed is not None and patch.status.get("phase") in ("Complete", "Failed"):
                pods = await kube.pod_dicts(client, dp.metadata.namespace, {"job-name": job["metadata"]["name"]})
                for pod in pods[-1:]:
                    for state in (pod.get("status") or {}).get("containerStatuses") or []:
                        if state.get("name") == "process" and (state.get("state") or {}).get("terminated"):
                            patch.status["exitCode"] = state["state"]["terminated"].get("exitCode")
                    patch.status["logTail"] = await kube.log_tail(client, pod["metadata"]["name"],
                                                                  dp.metadata.namespace, "process", dp.spec.log_lines)
        finally:
            await client.close()
        if observed is not None and patch.status.get("phase") in ("Pending", "Executing"):
            raise kopf.TemporaryError(f"DataProcess Job {observed['metadata']['name']} is running",
                                      delay=settings.retry_s)
