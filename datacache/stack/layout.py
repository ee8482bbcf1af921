"""Where a runtime's caches and a dataset's metadata live under ``$DATACACHE_HOME``.

- cache level ``L`` of runtime ``ns/name``: ``<L.path>/<ns>/<name>`` (a relative ``L.path`` is
  under the home), and worker ``i``'s own cache below it: ``.../worker-<i>``;
- hit counters of a runtime: ``stats/<ns>/<name>``;
- a dataset's manifest, sync marks and refresh record: ``datasets/<ns>/<name>/``.

Computed here only, so that the embedded host, the worker processes, the supervisor and the
readers always agree.
"""

from __future__ import annotations

import os


def level_dir(home: str, runtime, level, worker: str | None = None) -> str:
    """Directory of ``runtime``'s disk ``level`` (a ``tieredstore.levels[]`` model); with
    ``worker`` (``worker-<i>``) that worker's own directory below it."""
    base = os.path.join(home, os.path.expanduser(level.path))
    path = os.path.join(base, runtime.metadata.namespace, runtime.metadata.name)
    return os.path.join(path, worker) if worker else path


def stats_dir(home: str, runtime) -> str:
    """Directory of ``runtime``'s hit counters."""
    return os.path.join(home, "stats", runtime.metadata.namespace, runtime.metadata.name)


def dataset_dir(home: str, namespace: str, name: str) -> str:
    """Directory of dataset ``namespace/name``'s manifest and marks."""
    return os.path.join(home, "datasets", namespace, name)


def manifest_path(home: str, namespace: str, name: str) -> str:
    """The stored manifest (Parquet) of dataset ``namespace/name``."""
    return os.path.join(dataset_dir(home, namespace, name), "manifest.parquet")
