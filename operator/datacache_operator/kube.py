"""The few API calls the operator makes, through lightkube's async client.

Children are created, or merge-patched when they exist (so a changed spec reaches them); the
worker token Secret is only ever created, never replaced (a new token would lock clients out); a
finished Job (a Dataset's sync, an OnEvent warmup) is deleted before its next run is created.
"""

from __future__ import annotations

from typing import Any

from lightkube import AsyncClient
from lightkube.codecs import from_dict
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.resources.apps_v1 import DaemonSet, StatefulSet
from lightkube.resources.batch_v1 import CronJob, Job
from lightkube.resources.core_v1 import Pod
from lightkube.types import CascadeType, PatchType

from datacache.api.crds import CLUSTER_SCOPED, GROUP, PLURALS, VERSION

# lightkube raises ApiError only for responses typed exactly "application/json"; its base class
# (httpx's HTTPStatusError) covers every HTTP error status, and carries the code on the response.
HTTPStatusError = ApiError.__base__


def _code(err: Exception) -> int:
    return err.response.status_code  # type: ignore[attr-defined]


CUSTOM = {kind: (create_global_resource if kind in CLUSTER_SCOPED else create_namespaced_resource)(
    GROUP, VERSION, kind, plural) for kind, plural in PLURALS.items()}
"""lightkube resource classes of the datacache kinds (ThinRuntimeProfile is cluster-scoped)."""


async def ensure(client: AsyncClient, manifest: dict[str, Any], replace: bool = True) -> None:
    """Create ``manifest``; if it exists, merge-patch it (``replace``) or leave it as it is."""
    obj = from_dict(manifest)
    try:
        await client.create(obj)
    except HTTPStatusError as err:
        if _code(err) != 409:
            raise
        if replace:
            meta = manifest["metadata"]
            await client.patch(type(obj), meta["name"], manifest, namespace=meta["namespace"],
                               patch_type=PatchType.MERGE)


async def get_or_none(client: AsyncClient, kind: str, name: str, namespace: str | None) -> dict[str, Any] | None:
    """The object ``kind`` (a datacache kind, ``StatefulSet``, ``DaemonSet``, ``Job``, ``CronJob``) as a dict,
    or None when it does not exist; ``namespace`` is ignored for a cluster-scoped kind."""
    res = CUSTOM.get(kind) or _BUILTIN[kind]
    try:
        obj = await client.get(res, name, namespace=None if kind in CLUSTER_SCOPED else namespace)
    except HTTPStatusError as err:
        if _code(err) == 404:
            return None
        raise
    return obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)


_BUILTIN = {"StatefulSet": StatefulSet, "DaemonSet": DaemonSet, "Job": Job, "CronJob": CronJob}


async def delete(client: AsyncClient, kind: str, name: str, namespace: str) -> None:
    """Delete ``kind`` ``name`` (a kind :func:`get_or_none` knows), its dependents (a Job's pods)
    in the background; one already gone is not an error."""
    try:
        await client.delete(CUSTOM.get(kind) or _BUILTIN[kind], name, namespace=namespace,
                            cascade=CascadeType.BACKGROUND)
    except HTTPStatusError as err:
        if _code(err) != 404:
            raise


async def list_dicts(client: AsyncClient, kind: str, namespace: str) -> list[dict[str, Any]]:
    """Every object of datacache kind ``kind`` in ``namespace``, as dicts."""
    return [obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)
            async for obj in client.list(CUSTOM[kind], namespace=namespace)]


async def pod_dicts(client: AsyncClient, namespace: str, selector: dict[str, str]) -> list[dict[str, Any]]:
    """The pods matching label ``selector``, as dicts (oldest first)."""
    pods = [pod.to_dict() async for pod in client.list(Pod, namespace=namespace, labels=selector)]
    return sorted(pods, key=lambda p: p.get("metadata", {}).get("creationTimestamp") or "")


async def log_tail(client: AsyncClient, pod: str, namespace: str, container: str, lines: int) -> list[str]:
    """The last ``lines`` lines of a container's log; [] when the API cannot give it (a pod gone,
    a log not kept): the tail is a convenience, never a reason to fail."""
    try:
        return [line.rstrip("\n") async for line in client.log(pod, namespace=namespace, container=container,
                                                                tail_lines=lines)]
    except HTTPStatusError:
        return []


async def pod_ips(client: AsyncClient, namespace: str, selector: dict[str, str]) -> list[tuple[str, str]]:
    """(pod name, pod IP) of the running pods matching label ``selector``."""
    result = []
    async for pod in client.list(Pod, namespace=namespace, labels=selector):
        if pod.status and pod.status.podIP and pod.status.phase == "Running":
            result.append((pod.metadata.name, pod.status.podIP))
    return result
