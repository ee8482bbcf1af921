"""Where a runtime's caches and a dataset's metadata live under ``$DATACACHE_HOME``.

- cache level ``L`` of runtime ``ns/name``: ``<L.path>/<ns>/<name>`` (a relative ``L.path`` is
  under the home), and worker ``i``'s own cache below it: ``.../worker-<i>``;
- its file tier (complete file versions as contiguous files): ``<fileTier.path>/<ns>/<name>``, or
  beside the first disk level's directory, ``<L.path>/<ns>/<name>.files``;
- hit counters of a runtime: ``stats/<ns>/<name>``;
- a dataset's manifest, sync marks and refresh record: ``datasets/<ns>/<name>/``;
- the state file of the FUSE daemon serving a mount point: ``run/fuse/<mount key>.json``.

Computed here only, so that the embedded host, the worker processes, the supervisor and the
readers always agree.
"""

from __future__ import annotations

import hashlib
import os

from datacache import mountinfo
from datacache.api.quantity import parse_quantity


def level_dir(home: str, runtime, level, worker: str | None = None) -> str:
    """Directory of ``runtime``'s disk ``level`` (a ``tieredstore.levels[]`` model); with
    ``worker`` (``worker-<i>``) that worker's own directory below it."""
    path = level.directory(home, runtime.metadata.namespace, runtime.metadata.name)
    return os.path.join(path, worker) if worker else path


def file_tier(home: str, runtime) -> tuple[str, int] | None:
    """``(directory, quota bytes)`` of ``runtime``'s file tier (``tieredstore.fileTier``): its
    ``path``/<ns>/<name>, else beside the first disk level's directory (``<level dir>.files``,
    never inside it: the block tier owns that one). None when it is off (quota 0, or no disk level
    and no path)."""
    spec = runtime.spec.tieredstore.file_tier
    disk = next((lv for lv in runtime.spec.tieredstore.ordered_levels if lv.mediumtype != "MEM"), None)
    quota = parse_quantity(spec.quota) if spec.quota is not None else (disk.quota_bytes if disk else 0)
    if quota == 0:
        return None
    if spec.path is not None:
        base = os.path.join(home, os.path.expanduser(spec.path))
        return os.path.join(base, runtime.metadata.namespace, runtime.metadata.name), quota
    if disk is None:
        return None
    return level_dir(home, runtime, disk) + ".files", quota


def stats_dir(home: str, runtime) -> str:
    """Directory of ``runtime``'s hit counters."""
    return os.path.join(home, "stats", runtime.metadata.namespace, runtime.metadata.name)


def dataset_dir(home: str, namespace: str, name: str) -> str:
    """Directory of dataset ``namespace/name``'s manifest and marks."""
    return os.path.join(home, "datasets", namespace, name)


def manifest_path(home: str, namespace: str, name: str) -> str:
    """The stored manifest (Parquet) of dataset ``namespace/name``."""
    return os.path.join(dataset_dir(home, namespace, name), "manifest.parquet")


def mount_key(mountpoint: str) -> str:
    """12 hex digits naming ``mountpoint`` (its canonical path's SHA-1) in file names."""
    return hashlib.sha1(mountinfo.canonical(mountpoint).encode("utf-8", "surrogateescape")).hexdigest()[:12]


def fuse_state_path(home: str, mountpoint: str) -> str:
    """The state file of the FUSE daemon of ``home`` serving ``mountpoint``: there from before the
    mount answers until the daemon exits (a killed daemon's stays)."""
    return os.path.join(home, "run", "fuse", f"{mount_key(mountpoint)}.json")
