"""kopf handlers: thin functions that load the resource, call the shared reconcile steps and write
status. Run: ``kopf run -m datacache_operator.handlers --all-namespaces``.

CacheRuntimes and ThinRuntimes go through one reconcile (:func:`reconcile_runtime`), a
JuiceFSRuntime through :func:`juicefs_runtime_changed` (its clients run in readers' sidecars);
a Dataset binds to its CacheRuntime, else its ThinRuntime, else its JuiceFSRuntime, of the same name, as in embedded mode, and then
gets its metadata sync Job (:mod:`.syncjob`), which writes the Dataset's figures and marks the
OnEvent DataLoads whose targets changed; a mark starts that DataLoad's warmup Job. DataMigrates and
DataProcesses (and DataLoads with ``runAfter``) start in flow order (:mod:`.flow_handlers`).

"Not ready yet" (no Dataset for a runtime, workers still starting, a Job still running) is a
``kopf.TemporaryError`` with a delay: kopf retries later, the resource does not fail. A wrong spec
is a ``kopf.PermanentError`` whose message names the resource, field and fix.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import kopf
from lightkube import AsyncClient

from datacache.api.crds import GROUP, VERSION
from datacache.api.models import RUNTIME_PLUGIN_GROUP, plugin_schemes
from datacache.control import autoscale, reconcile
from datacache.control.kubestatus import SYNC_EVENT_ANNOTATION
from datacache.errors import ConfigError

from . import flow_handlers, kube, manifests, syncjob, webhook, worker_reports
from .api_objects import from_body
from .settings import Settings

SETTINGS = Settings.from_env()
RETRY_S = SETTINGS.retry_s


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Operator settings: our finalizer name, warnings as events, the admission webhook server."""
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.posting.level = 30  # warnings and errors as Kubernetes events
    # The chart mounts the webhook's TLS Secret in cert_dir; without one (tests on loopback) the
    # admission server speaks plain HTTP on 127.0.0.1 only.
    cert_dir = SETTINGS.webhook_cert_dir
    settings.admission.server = kopf.WebhookServer(
        addr="0.0.0.0" if cert_dir else "127.0.0.1", port=SETTINGS.webhook_port, insecure=not cert_dir,
        certfile=f"{cert_dir}/tls.crt" if cert_dir else None, pkeyfile=f"{cert_dir}/tls.key" if cert_dir else None)


def _load(body: Any) -> Any:
    try:
        return from_body(body)
    except ConfigError as err:
        # `kubectl describe` shows it: one line naming the resource, the field and the fix
        kopf.event(body, type="Warning", reason="InvalidSpec", message=str(err))
        raise kopf.PermanentError(str(err)) from None


async def _dataset_for(client: AsyncClient, name: str, namespace: str) -> Any:
    found = await kube.get_or_none(client, "Dataset", name, namespace)
    if found is None:
        raise kopf.TemporaryError(f"Dataset {namespace}/{name} not found yet: create it "
                                  "(a runtime binds to the Dataset of the same name)", delay=RETRY_S)
    return _load(found)


RUNTIME_KINDS = ("CacheRuntime", "ThinRuntime", "JuiceFSRuntime")
"""The kinds a Dataset binds to (same name and namespace), looked up in this order, as embedded."""


async def _runtime_body(client: AsyncClient, name: str, namespace: str) -> dict[str, Any] | None:
    """The API object of the runtime bound to Dataset ``namespace/name``, or None."""
    for kind in RUNTIME_KINDS:
        found = await kube.get_or_none(client, kind, name, namespace)
        if found is not None:
            return found
    return None


async def _profile_for(client: AsyncClient, runtime: Any) -> tuple[Any, str]:
    """``(profile, problem)``: a ThinRuntime's ThinRuntimeProfile model, or why the runtime cannot
    work (profile missing, or its plugin not installed in the image: the same check embedded makes);
    ``(None, "")`` for a CacheRuntime."""
    if runtime.kind != "ThinRuntime":
        return None, ""
    who = f"thinruntime {runtime.metadata.namespace}/{runtime.metadata.name}"
    name = runtime.spec.profile_name
    found = await kube.get_or_none(client, "ThinRuntimeProfile", name, None)
    if found is None:
        return None, f"{who}: spec.profileName: thinruntimeprofile {name!r} not found: apply it first"
    profile = _load(found)
    plugin = profile.spec.plugin
    if plugin is not None and plugin not in plugin_schemes():
        return profile, (f"{who}: plugin {plugin!r} is not installed in image {SETTINGS.image} (no entry point "
                         f"in group {RUNTIME_PLUGIN_GROUP!r}): build the image with the plugin's package")
    return profile, ""


async def _worker_metrics(client: AsyncClient, runtime: Any) -> list[autoscale.WorkerMetrics]:
    """Capacity and used bytes of the runtime's running worker pods, from their /metrics."""
    pods = await kube.pod_ips(client, runtime.metadata.namespace, manifests.worker_labels(runtime))
    port = manifests.worker_port(runtime)
    return await worker_reports.scrape([(pod, f"http://{ip}:{port}") for pod, ip in pods])


def _reconciled(plural: str, timer_id: str) -> Any:
    """kopf decorators running a handler on create, spec update, operator restart and every
    ``status_interval_s`` (a status refresh, under its own id so it never mixes with creation)."""
    def register(fn: Any) -> Any:
        fn = kopf.timer(GROUP, VERSION, plural, interval=SETTINGS.status_interval_s,
                        idle=SETTINGS.status_interval_s, id=timer_id)(fn)
        fn = kopf.on.resume(GROUP, VERSION, plural)(fn)
        fn = kopf.on.update(GROUP, VERSION, plural, field="spec")(fn)
        return kopf.on.create(GROUP, VERSION, plural)(fn)
    return register


async def reconcile_runtime(body: Any, patch: kopf.Patch) -> None:
    """Create or update a CacheRuntime's or ThinRuntime's children and write its status; raises
    TemporaryError until every desired worker is ready. A ThinRuntime whose profile is missing or
    whose plugin is not installed gets phase Failed with the reason, and no workers, and is looked
    at again later (a profile applied afterwards makes it work)."""
    runtime = _load(body)
    name, namespace = runtime.metadata.name, runtime.metadata.namespace
    client = AsyncClient()
    try:
        dataset = await _dataset_for(client, name, namespace)
        profile, problem = await _profile_for(client, runtime)
        if problem:
            patch.status.update(reconcile.runtime_status(runtime.spec.replicas, [], problem))
            raise kopf.TemporaryError(problem, delay=RETRY_S)
        await kube.ensure(client, manifests.config_map(dataset, runtime, body, profile))
        await kube.ensure(client, manifests.token_secret(runtime, secrets.token_urlsafe(32), body), replace=False)
        await kube.ensure(client, manifests.headless_service(runtime, body))
        workload = manifests.worker_workload(dataset, runtime, body, SETTINGS, profile)
        await kube.ensure(client, workload)
        observed = await kube.get_or_none(client, workload["kind"], workload["metadata"]["name"], namespace)
        metrics = await _worker_metrics(client, runtime)
    finally:
        await client.close()
    workload_status = (observed or {}).get("status") or {}
    desired = (workload_status.get("desiredNumberScheduled") if workload["kind"] == "DaemonSet"
               else runtime.spec.replicas)
    workers = [worker_reports.status_entry(m) for m in metrics]
    status = reconcile.runtime_status(desired or 0, workers)
    status["selector"] = manifests.selector(runtime)
    patch.status.update(status)
    if status["readyWorkers"] < status["desiredWorkers"]:
        raise kopf.TemporaryError(f"{status['readyWorkers']}/{status['desiredWorkers']} workers ready", delay=RETRY_S)


@_reconciled("thinruntimes", timer_id="thinruntime_status")
@_reconciled("cacheruntimes", timer_id="runtime_status")
async def runtime_changed(body: Any, patch: kopf.Patch, **_: Any) -> None:
    """A CacheRuntime or ThinRuntime was created, changed, found at start-up, or is due a status refresh."""
    await reconcile_runtime(body, patch)


@_reconciled("juicefsruntimes", timer_id="juicefsruntime_status")
async def juicefs_runtime_changed(body: Any, patch: kopf.Patch, **_: Any) -> None:
    """A JuiceFSRuntime: its ConfigMap (what the sidecars and DataLoad Jobs apply) and token Secret
    (their pods' environment names it); its clients run in those pods, so its status says the
    runtime is rendered, with the levels' capacity (cached bytes are the Dataset's, from its pods)."""
    runtime = _load(body)
    name, namespace = runtime.metadata.name, runtime.metadata.namespace
    client = AsyncClient()
    try:
        dataset = await _dataset_for(client, name, namespace)
        await kube.ensure(client, manifests.config_map(dataset, runtime, body))
        await kube.ensure(client, manifests.token_secret(runtime, secrets.token_urlsafe(32), body), replace=False)
    finally:
        await client.close()
    patch.status.update(reconcile.client_runtime_status(runtime))


@kopf.timer(GROUP, VERSION, "cacheruntimes", interval=SETTINGS.status_interval_s,
            initial_delay=SETTINGS.status_interval_s)
async def runtime_autoscale(body: Any, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """Apply the runtime's autoscale policy to ``spec.replicas`` (what the scale subresource
    writes). On scale-in the StatefulSet removes its highest ordinals, not ``decision.remove``, and
    their blocks are not handed off: hand-off (:mod:`datacache.cluster.peers`) is pulled from a live
    holder, and a terminating pod leaves DNS at once. Their new owners re-read those blocks from
    the UFS on the next miss (README, "Scale-in on Kubernetes")."""
    runtime = _load(body)
    if runtime.spec.autoscale is None:
        return
    client = AsyncClient()
    try:
        workers = await _worker_metrics(client, runtime)
    finally:
        await client.close()
    now = time.time()
    memo.below_since = autoscale.low_since(runtime.spec.autoscale, workers, now, memo.get("below_since"))
    decision = autoscale.decide(runtime.spec.autoscale, runtime.spec.replicas, workers, now,
                                memo.get("last_scale"), below_since=memo.below_since)
    if decision.replicas != runtime.spec.replicas:
        memo.last_scale = now
        patch.spec["replicas"] = decision.replicas
        kopf.event(body, type="Normal", reason="Scaled", message=decision.reason)


async def _run_sync(client: AsyncClient, dataset: Any, runtime: Any, body: Any) -> dict[str, Any] | None:
    """Ensure the Dataset's sync ServiceAccount, RoleBinding and manifest claim, and start a new
    sync Job when one is due (:func:`.syncjob.sync_due`); returns the current Job (None: not
    created yet)."""
    namespace = dataset.metadata.namespace
    await kube.ensure(client, syncjob.service_account(dataset, body))
    await kube.ensure(client, syncjob.role_binding(dataset, body, SETTINGS))
    await kube.ensure(client, syncjob.metadata_claim(dataset, body, SETTINGS), replace=False)
    name = syncjob.names(dataset)["job"]
    job = await kube.get_or_none(client, "Job", name, namespace)
    generation = body["metadata"].get("generation") or 1
    if not syncjob.sync_due(job, generation, dataset.spec.auto_sync_interval, time.time()):
        return job
    if job is not None:  # a Job's pod template is immutable: the next run is a new Job
        await kube.delete(client, "Job", name, namespace)
    await kube.ensure(client, syncjob.sync_job(dataset, runtime, body, SETTINGS, generation), replace=False)
    return await kube.get_or_none(client, "Job", name, namespace)


@_reconciled("datasets", timer_id="dataset_status")
async def dataset_changed(body: Any, patch: kopf.Patch, **_: Any) -> None:
    """Dataset status: NotBound without a CacheRuntime (or ThinRuntime) of the same name. Once
    bound, its metadata sync Job runs (:mod:`.syncjob`; again on a spec change and every
    ``spec.autoSyncInterval`` seconds): the Dataset is Updating while it runs, Failed (saying where
    the logs are) when it failed, Pending until a sync reported the manifest, then Bound. The
    figures (ufsTotal, fileNum, cacheStates) are the sync Job's to write
    (:mod:`datacache.control.kubestatus`), never the operator's."""
    dataset = _load(body)
    client = AsyncClient()
    try:
        runtime = await _runtime_body(client, dataset.metadata.name, dataset.metadata.namespace)
        job = None if runtime is None else await _run_sync(client, dataset, _load(runtime), body)
    finally:
        await client.close()
    updating, sync_error = syncjob.sync_state(job)
    reported = (body.get("status") or {}).get("fileNum") is not None
    status = reconcile.dataset_status(reconcile.DatasetObservation(
        bound=runtime is not None, synced=reported, updating=updating, sync_error=sync_error))
    for key in ("ufsTotal", "fileNum", "cacheStates"):
        status.pop(key)
    patch.status.update(status)


@kopf.on.update(GROUP, VERSION, "dataloads", field=("metadata", "annotations", SYNC_EVENT_ANNOTATION),
                id="dataload_sync_event")
@_reconciled("dataloads", timer_id="dataload_status")
async def dataload_changed(body: Any, patch: kopf.Patch, **_: Any) -> None:
    """Start the DataLoad's Job (policy Once), CronJob (policy Cron) or, policy OnEvent, a Job for
    each metadata sync that marked it (annotation ``datacache.io/sync-event``, set by the Dataset's
    sync Job when its diff touched the targets; a run still going finishes first), then follow it;
    a running Job is a TemporaryError until it completes or fails."""
    dataload = _load(body)
    if dataload.spec.run_after is not None:  # a step of a flow: not before its predecessor completed
        client = AsyncClient()
        try:
            if not await flow_handlers.gate(client, dataload, patch, RETRY_S):
                return
        finally:
            await client.close()
    ds, namespace = dataload.spec.dataset, dataload.metadata.namespace
    event = dataload.metadata.annotations.get(SYNC_EVENT_ANNOTATION, "") if dataload.spec.policy == "OnEvent" else ""
    if dataload.spec.policy == "OnEvent" and not event:
        patch.status["phase"] = "Pending"  # until a sync finds added or changed files under the targets
        return
    client = AsyncClient()
    try:
        dataset = await _dataset_for(client, ds.name, ds.namespace)
        runtime_body = await _runtime_body(client, ds.name, ds.namespace)
        if runtime_body is None:
            raise kopf.TemporaryError(f"CacheRuntime (or ThinRuntime) {ds.namespace}/{ds.name} not found yet",
                                      delay=RETRY_S)
        job = manifests.dataload_job(dataload, dataset, _load(runtime_body), body, SETTINGS, event)
        if event:
            await _replace_event_job(client, job)
        # a Job's pod template is immutable; a CronJob follows spec changes
        await kube.ensure(client, job, replace=job["kind"] == "CronJob")
        observed = await kube.get_or_none(client, job["kind"], job["metadata"]["name"], namespace)
    finally:
        await client.close()
    if job["kind"] == "CronJob":
        patch.status.update(manifests.cron_status((observed or {}).get("status")))
        return
    phase = manifests.job_phase((observed or {}).get("status"))
    patch.status["phase"] = phase
    if phase in ("Pending", "Executing"):
        raise kopf.TemporaryError(f"DataLoad Job {job['metadata']['name']} is {phase}", delay=RETRY_S)


async def _replace_event_job(client: AsyncClient, job: dict[str, Any]) -> None:
    """Delete the finished Job of an earlier sync event so that ``job`` (for a newer one) can be
    created; raises TemporaryError while that earlier run is still going."""
    meta = job["metadata"]
    current = await kube.get_or_none(client, "Job", meta["name"], meta["namespace"])
    ran = ((current or {}).get("metadata", {}).get("annotations") or {}).get(SYNC_EVENT_ANNOTATION)
    if current is None or ran == meta["annotations"][SYNC_EVENT_ANNOTATION]:
        return
    if manifests.job_phase(current.get("status")) in ("Pending", "Executing"):
        raise kopf.TemporaryError(f"DataLoad Job {meta['name']} of an earlier sync is still running: the run for "
                                  "the newer sync starts after it", delay=RETRY_S)
    await kube.delete(client, "Job", meta["name"], meta["namespace"])


flow_handlers.register(_reconciled, _load, SETTINGS)  # DataMigrate, DataProcess


@kopf.on.mutate("pods", labels={manifests.DATASET_LABEL: kopf.PRESENT}, operations={"CREATE"}, id="fuse-sidecar")
async def fuse_sidecar(body: Any, patch: kopf.Patch, **_: Any) -> None:
    """Admission: give a pod labelled ``datacache.io/dataset: NAME`` the dataset's FUSE mount."""
    name = body["metadata"]["labels"][manifests.DATASET_LABEL]
    namespace = body["metadata"].get("namespace") or "default"
    client = AsyncClient()
    try:
        dataset_body = await kube.get_or_none(client, "Dataset", name, namespace)
        runtime_body = await _runtime_body(client, name, namespace)
    finally:
        await client.close()
    if dataset_body is None or runtime_body is None:
        missing = "Dataset" if dataset_body is None else "CacheRuntime (or ThinRuntime)"
        raise kopf.AdmissionError(f"pod label {manifests.DATASET_LABEL}={name}: no {missing} '{name}' in namespace "
                                  f"'{namespace}': create it first or fix the label", code=400)
    try:
        changes = webhook.inject(dict(body), _load(dataset_body), _load(runtime_body), SETTINGS)
    except (webhook.InjectionError, kopf.PermanentError) as err:
        raise kopf.AdmissionError(str(err), code=400) from None
    for key, value in changes.items():
        patch.spec[key] = value
