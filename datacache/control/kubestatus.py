"""A metadata sync reported to Kubernetes: ``datacache sync NAME --report-status kubernetes``.

On Kubernetes the operator runs each Dataset's metadata sync as Job ``<dataset>-sync`` (see
``datacache_operator.syncjob``), as Fluid's runtime master computes ``ufsTotal`` for its operator.
The Job's pod keeps the previous manifest on a PersistentVolumeClaim, so the sync diffs against it
exactly as embedded does (:func:`datacache.control.embedded.Embedded.sync`). Afterwards this module

1. measures the cache: ``cached`` is the bytes of the new manifest's *current-version* blocks that
   the runtime's workers hold, found by asking the workers DNS membership lists
   (:mod:`datacache.cluster.discovery`) with their batched ``POST /v1/exists``: each block is
   asked of its HRW owner first, then of its runners-up (``placement.lookup``, the places a read
   looks), so a block away from home still counts and a block of an old version never does;
   ``cacheCapacity`` and the hit ratio are the sums of the workers' ``/metrics``;
2. merge-patches ``ufsTotal``, ``fileNum`` and ``cacheStates`` (``cachedPercentage`` = cached /
   ufsTotal, as :func:`.reconcile.dataset_status` computes it) into the Dataset's status; the
   phase and conditions stay the operator's, which follows the Job;
3. marks each OnEvent DataLoad of the Dataset whose targets hold added or changed files
   (:func:`.dataloads.touched`) with annotation :data:`SYNC_EVENT_ANNOTATION` = the sync's time:
   the operator turns a new mark into a warmup Job.

The pod's ServiceAccount may get/patch ``datasets/status`` and get/list/patch ``dataloads`` in its
namespace, nothing else (the chart's ClusterRole ``datacache-sync``, bound per namespace); it reads
no Secret: the UFS credentials are files mounted from the Dataset's Secrets.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass

from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.core.exceptions import ApiError, ConfigError as KubeConfigError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.types import PatchType

from datacache.api.crds import GROUP, PLURALS, VERSION
from datacache.cluster import auth
from datacache.cluster.worker_client import LoopThread, WorkerClient
from datacache.cluster.member import Member
from datacache.cluster.membership import open_membership
from datacache.cluster.placement import lookup
from datacache.control import dataloads, observe, reconcile
from datacache.stack import readpath
from datacache.state import now_iso
from datacache.errors import ResourceError
from datacache.manifest import Manifest, ManifestDiff

log = logging.getLogger(__name__)

SYNC_EVENT_ANNOTATION = "datacache.io/sync-event"
"""Annotation on an OnEvent DataLoad: the time (RFC 3339) of the last metadata sync whose diff
touched its targets. The operator starts one warmup Job per value."""
FIELD_MANAGER = "datacache-sync"
# lightkube raises ApiError only for responses typed exactly "application/json"; its HTTP library's
# base classes cover every error status (HTTPStatusError) and transport failures (HTTPError).
_HTTPStatusError = ApiError.__base__
_HTTPError = _HTTPStatusError.__base__
_DATASET = create_namespaced_resource(GROUP, VERSION, "Dataset", PLURALS["Dataset"])
_DATALOAD = create_namespaced_resource(GROUP, VERSION, "DataLoad", PLURALS["DataLoad"])


@dataclass(frozen=True)
class WorkerFigures:
    """What the live workers hold of one dataset: ``cached`` bytes of current-version blocks,
    ``capacity`` bytes of their stores, block ``hits``/``misses`` served, ``workers`` asked."""

    cached: int
    capacity: int
    hits: int
    misses: int
    workers: int


def worker_figures(manifest: Manifest, members: list[Member], token: str, dataset: str,
                   block_size: int) -> WorkerFigures:
    """Ask ``members`` (live workers) which current-version blocks of ``manifest`` they hold, and
    for their metrics. A worker that does not answer holds nothing (its blocks are asked of the
    next candidate); block ``i``'s candidates are ``placement.lookup(key)``."""
    by_id = {m.worker_id: m for m in members}
    client = WorkerClient(token, dataset, block_size, read_timeout=30.0)
    io = LoopThread("datacache-kubestatus")
    try:
        cached = 0
        for keys, lengths in observe.current_blocks(manifest, dataset, block_size):
            cached += _held_bytes(io, client, by_id, keys, lengths)
        samples = io.gather([client.metrics(m.url, m.worker_id) for m in members])
        io.run(client.close())
    finally:
        io.close()
    answered = [s for s in samples if isinstance(s, dict)]

    def total(name: str) -> int:
        return sum(int(s.get(name, 0)) for s in answered)
    return WorkerFigures(cached=cached, capacity=total("datacache_worker_total_capacity_bytes"),
                         hits=total("datacache_worker_hits_total"), misses=total("datacache_worker_misses_total"),
                         workers=len(answered))


def _held_bytes(io: LoopThread, client: WorkerClient, by_id: dict[str, Member], keys: list[str],
                lengths: list[int]) -> int:
    """Bytes of ``keys`` held by some worker: asked in rounds, candidate ``depth`` of each key
    still unfound in round ``depth``, one batched request per worker per round."""
    if not by_id or not keys:
        return 0
    ranks = [lookup(key, by_id) for key in keys]
    pending = list(range(len(keys)))
    held = 0
    for depth in range(max(len(r) for r in ranks)):
        asks: dict[str, list[int]] = defaultdict(list)
        for j in pending:
            if depth < len(ranks[j]):
                asks[ranks[j][depth]].append(j)
        if not asks:
            break
        answers = io.gather([client.exists(by_id[w].url, w, [keys[j] for j in js]) for w, js in asks.items()])
        pending = []
        for (worker, js), answer in zip(asks.items(), answers):
            if isinstance(answer, BaseException):
                log.warning("cache worker %s did not answer (%s): its blocks are asked elsewhere", worker, answer)
                pending += js
                continue
            for j, found in zip(js, answer):
                if found:
                    held += lengths[j]
                else:
                    pending.append(j)
    return held


def dataset_figures(manifest: Manifest, figures: WorkerFigures | None) -> dict:
    """The Dataset status fields a sync reports (``ufsTotal``, ``fileNum``, ``cacheStates``) from
    ``manifest`` and the workers' ``figures`` (None: the workers could not be listed, so the cache
    figures are ``-``)."""
    f = figures or WorkerFigures(0, 0, 0, 0, 0)
    status = reconcile.dataset_status(reconcile.DatasetObservation(
        bound=True, synced=figures is not None, file_num=manifest.file_num, ufs_total=manifest.total_size,
        cached=f.cached, capacity=f.capacity, hits=f.hits, misses=f.misses))
    # Local/remote split: pods read the workers over HTTP; the workers do not tell which node asked.
    for key in ("localHitRatio", "remoteHitRatio"):
        status["cacheStates"].pop(key)
    return {key: status[key] for key in ("ufsTotal", "fileNum", "cacheStates")}


def connect() -> Client:
    """A client of the Kubernetes API (in-cluster credentials or ``KUBECONFIG``), made before any
    work so that a run outside a cluster fails first with ``no Kubernetes API access``. Raises
    ``ResourceError``."""
    try:
        return Client(KubeConfig.from_env(), field_manager=FIELD_MANAGER)
    except KubeConfigError as err:
        raise ResourceError(f"--report-status kubernetes: no Kubernetes API access ({err}): run it in the "
                            "operator's sync Job (its ServiceAccount) or set KUBECONFIG") from None


def _api_call(what: str, call):
    try:
        return call()
    except _HTTPStatusError as err:
        code = err.response.status_code
        hint = {403: ": the pod's ServiceAccount lacks the permission (the chart's ClusterRole datacache-sync, "
                     "bound by RoleBinding <dataset>-sync)",
                404: ": not found in the cluster"}.get(code, "")
        raise ResourceError(f"--report-status kubernetes: {what}: HTTP {code}{hint}") from None
    except _HTTPError as err:
        raise ResourceError(f"--report-status kubernetes: {what}: API server unreachable ({err})") from None


def report(plane, name: str, namespace: str, diff: ManifestDiff, client: Client | None = None) -> list[str]:
    """Report the sync of Dataset ``namespace/name`` that just ran in ``plane`` (an ``Embedded``)
    and returned ``diff``: patch the Dataset's status, mark the touched OnEvent DataLoads. Returns
    the names of the DataLoads marked. ``client``: from :func:`connect` (made here when None, and
    closed either way). A runtime without cache workers (``readpath.distributed`` false: replicas
    0, or 1 outside a cluster) needs no worker token; its cache figures are ``-``. Raises
    ``ResourceError`` (one line, no credentials) when the API cannot be reached or refuses a call."""
    client = client or connect()
    try:
        return _report(client, plane, name, namespace, diff)
    finally:
        client.close()


def _report(client: Client, plane, name: str, namespace: str, diff: ManifestDiff) -> list[str]:
    ds = plane.get("Dataset", name, namespace)
    runtime = plane.runtime_for(ds)
    manifest = plane.load_manifest(ds)
    figures = None
    if runtime is not None and readpath.distributed(runtime):
        members = open_membership(plane.home)
        try:
            live = members.live(namespace, runtime.metadata.name)
        except OSError as err:  # MembershipUnavailableError: DNS is down; ufsTotal is still worth reporting
            log.warning("%s: cache figures not reported", err)
        else:
            token = auth.load_token(plane.home, namespace, runtime.metadata.name)
            figures = worker_figures(manifest, live, token, name, runtime.spec.block_size_bytes)
        finally:
            members.close()
    status = dataset_figures(manifest, figures)
    _api_call(f"patch dataset {namespace}/{name} status", lambda: client.patch(
        _DATASET.Status, name, {"status": status}, namespace=namespace, patch_type=PatchType.MERGE))
    event = now_iso()
    marked = []
    for obj in _api_call(f"list dataloads in namespace {namespace}",
                         lambda: list(client.list(_DATALOAD, namespace=namespace))):
        spec = obj.spec or {}
        if spec.get("policy") != "OnEvent" or (spec.get("dataset") or {}).get("name") != name:
            continue
        if not dataloads.touched([t["path"] for t in spec.get("target") or []], manifest, diff):
            continue
        dl = obj.metadata.name
        _api_call(f"annotate dataload {namespace}/{dl}", lambda: client.patch(
            _DATALOAD, dl, {"metadata": {"annotations": {SYNC_EVENT_ANNOTATION: event}}},
            namespace=namespace, patch_type=PatchType.MERGE))
        marked.append(dl)
    return marked
