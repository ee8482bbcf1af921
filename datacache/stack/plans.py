"""Plans and traces of a dataset under ``$DATACACHE_HOME``: the glue between a ReadPath (which
knows where a dataset's manifest and directory are) and :mod:`datacache.plan`."""

from __future__ import annotations

from datacache.errors import ResourceError
from datacache.plan import channel, trace
from datacache.plan.plan import Plan, make_plan
from datacache.stack import layout


def publish_plan(paths, dataset: str, order, namespace: str = "default", epoch: int = -1, rank: int = 0,
                 world: int = 1) -> tuple[Plan, str]:
    """Check ``order`` (dataset paths in read order) against dataset ``namespace/dataset``'s
    stored manifest and publish it as rank ``rank``'s plan (``paths``: a ReadPath). Returns
    ``(plan, its file)``. Raises ResourceError (no such dataset, never synced) or PlanError."""
    ds = paths.get("Dataset", dataset, namespace)
    manifest = paths.load_manifest(ds)
    if manifest is None:
        raise ResourceError(f"dataset {namespace}/{dataset} has no manifest yet: run 'datacache sync {dataset}'")
    plan = make_plan(dataset, order, manifest, epoch, rank, world)
    return plan, channel.publish(layout.dataset_dir(paths.home, namespace, dataset), plan)


def withdraw_plans(home: str, dataset: str, namespace: str = "default", rank: int | None = None) -> int:
    """Remove the dataset's plan of ``rank`` (None: all); returns how many."""
    return channel.withdraw(layout.dataset_dir(home, namespace, dataset), rank)


def traced(home: str, dataset: str, namespace: str = "default", run: str | None = None):
    """``(run, [(path, bytes), ...])`` of the dataset's trace ``run`` (None: the last one), see
    :func:`datacache.plan.trace.read_trace`."""
    return trace.read_trace(layout.dataset_dir(home, namespace, dataset), dataset, run)


def recorder(home: str, dataset: str, namespace: str = "default", run: str | None = None) -> trace.TraceRecorder:
    """A recorder of run ``run`` (None: named by the time) of the dataset's accesses."""
    return trace.TraceRecorder(layout.dataset_dir(home, namespace, dataset), run)


def last_trace_cached(client, home: str, namespace: str = "default") -> tuple[int, int] | None:
    """``(cached bytes, bytes)`` of the files of ``client``'s dataset's last trace, current
    versions; None when no trace was recorded."""
    try:
        _, files = traced(home, client.name, namespace)
    except ResourceError:
        return None
    entries = [e for e in map(client.manifest.lookup, (p for p, _ in files)) if e is not None]
    return client.cached_bytes(entries), sum(e.size for e in entries)
