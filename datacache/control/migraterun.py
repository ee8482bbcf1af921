"""Running a DataMigrate on the embedded host: open both ends, copy (:mod:`.migrate`), write
status (live progress at most once a second), sync the Dataset copied into."""

from __future__ import annotations

import threading
import time

from datacache.api.dataflow import DataMigrate, DatasetPath
from datacache.api.models import Dataset
from datacache.control import flowstatus
from datacache.control.migrate import MigrateProgress, copy_tree
from datacache.errors import DatacacheError, ResourceError, describe_error
from datacache.state import now_iso
from datacache.ufs.credentials import redact
from datacache.ufs.mounts import UnionNamespace

FAILURES_KEPT = 100
"""Per-file failures kept in status (the count is in ``progress``)."""


def _dataset_end(plane, ref: DatasetPath, namespace: str) -> tuple:
    """``(fs, root, secrets)`` of the mount of Dataset ``ref`` holding ``ref.path``. Raises
    ResourceError when the path is not inside exactly one mount."""
    ds = plane.get("Dataset", ref.name, ref.namespace or namespace)
    ufs = plane.ufs_for(ds)
    best = None
    for mount in ufs.mounts.values():
        prefix = "/" + mount.prefix if mount.prefix else "/"
        if ref.path == prefix or prefix == "/" or ref.path.startswith(prefix + "/"):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, mount)
    if best is None:
        names = ", ".join("/" + m.prefix for m in ufs.mounts.values())
        raise ResourceError(f"dataset {ds.metadata.namespace}/{ds.metadata.name}: path {ref.path} is in none of "
                            f"its mounts ({names}): name a path inside one mount")
    prefix, mount = best
    rel = ref.path[len(prefix):].strip("/")
    return mount.fs, f"{mount.root.rstrip('/')}/{rel}".rstrip("/") if rel else mount.root, ufs.secrets


def _external_end(plane, dm: DataMigrate, storage) -> tuple:
    stub = Dataset.model_validate({"metadata": {"name": dm.metadata.name, "namespace": dm.metadata.namespace},
                                   "spec": {"mounts": [storage.as_mount()]}})
    ufs = UnionNamespace(stub, plane.home)
    try:
        mount = ufs.mounts["external"]
    except ResourceError as err:  # "dataset 'x': spec.mounts[0]" would be wrong here: say the field
        raise ResourceError(str(err).replace(f"dataset {dm.metadata.name!r}: spec.mounts[0]",
                                             f"datamigrate {dm.metadata.namespace}/{dm.metadata.name}: "
                                             "externalStorage")) from None
    return mount.fs, mount.root, ufs.secrets


def _end(plane, dm: DataMigrate, side) -> tuple:
    if side.dataset is not None:
        return _dataset_end(plane, side.dataset, dm.metadata.namespace)
    return _external_end(plane, dm, side.external_storage)


def run_migrate(plane, dm: DataMigrate, cancel: threading.Event | None = None) -> tuple[bool, str]:
    """Run ``dm`` now on ``plane`` (an ``Embedded``); returns ``(ok, reason)``. Status goes
    Executing (``progress``: files, bytes, rate, ETA) → Complete, or Failed with per-file
    ``failures`` and the reason. After a copy into a Dataset, that Dataset is synced (a failed
    sync fails the migrate). Errors are in the status and the result, never raised."""
    meta, spec = dm.metadata, dm.spec
    started, t0 = now_iso(), time.monotonic()
    previous = (plane.state.get("DataMigrate", meta.name, meta.namespace) or {}).get("status") or {}
    kept = {k: previous[k] for k in ("lastSuccessfulTime",) if k in previous}

    def write(status: dict) -> None:
        plane.state.set_status("DataMigrate", meta.name, meta.namespace, {**kept, **status})

    running = flowstatus.executing(started)
    write(running)
    last = [0.0]

    def on_progress(p: MigrateProgress) -> None:
        now = time.monotonic()
        if now - last[0] >= 1.0:
            last[0] = now
            write({**running, "progress": p.as_status()})

    secrets: list[str] = []
    try:
        src_fs, src_root, src_secrets = _end(plane, dm, spec.from_)
        dst_fs, dst_root, dst_secrets = _end(plane, dm, spec.to)
        secrets = src_secrets + dst_secrets
        progress = copy_tree(src_fs, src_root, dst_fs, dst_root, spec.parallelism, spec.overwrite, secrets,
                             on_progress, cancel)
    except (DatacacheError, OSError) as err:
        reason = redact(describe_error(err), secrets)
        write(flowstatus.finished("Failed", started, t0, "MigrateFailed", reason))
        return False, reason
    fields = {"progress": progress.as_status(),
              "failures": [{"path": p, "message": m} for p, m in progress.failures[:FAILURES_KEPT]],
              "skipped": [{"path": p, "reason": r} for p, r in progress.kept[:FAILURES_KEPT]]}
    if cancel is not None and cancel.is_set():
        write(flowstatus.finished("Cancelled", started, t0, "Cancelled", "cancelled: run it again to resume", **fields))
        return False, "cancelled"
    if progress.failures:
        path, message = progress.failures[0]
        reason = f"{len(progress.failures)} of {progress.files_total} files failed (first: {path}: {message})"
        write(flowstatus.finished("Failed", started, t0, "FilesFailed", reason, **fields))
        return False, reason
    if spec.into_dataset:
        ref = spec.to.dataset
        try:
            plane.sync(ref.name, ref.namespace or meta.namespace)
        except (DatacacheError, OSError) as err:
            reason = f"copied, but the metadata sync of dataset {ref.name} failed: {describe_error(err)}"
            write(flowstatus.finished("Failed", started, t0, "SyncFailed", reason, **fields))
            return False, reason
    message = (f"{progress.files_done} files copied, {progress.files_skipped} already at the destination"
               + (f", {len(progress.kept)} newer destination files kept" if progress.kept else ""))
    write(flowstatus.finished("Complete", started, t0, "Complete", message, **fields))
    return True, message
