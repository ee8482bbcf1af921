"""Which worker indexes a distributed CacheRuntime runs: ``worker-<i>`` for each ``i`` in the set.

A StatefulSet always removes its highest ordinals; here scale-in removes the workers the autoscale
decision names (the least hot ones), so the set can have gaps (``[0, 2, 3]``). Placement is HRW
over the live worker ids (:mod:`datacache.cluster.placement`), so any subset serves every block;
a removed worker's cache directory stays on disk and is used again when its index comes back.

The set is kept in ``$DATACACHE_HOME/runtimes/<ns>/<name>/workers.json`` (0600), written by the
control plane when it scales and read by the supervisor each poll. When ``replicas`` changes by any
other way (``datacache apply``), :func:`plan` adapts the stored set: the lowest free indexes are
added, the highest removed.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Iterable

from datacache import private
from datacache.cluster.auth import runtime_dir

FILE = "workers.json"


def plan(replicas: int, current: Iterable[int] | None, remove: Iterable[int] = ()) -> list[int]:
    """The sorted indexes of ``replicas`` workers, changing ``current`` (None: ``0..replicas-1``)
    as little as possible: ``remove`` goes first, then the highest extra ones; missing workers
    take the lowest free indexes (a removed index comes back before a new one is used)."""
    gone = set(remove)
    kept = sorted(set(current if current is not None else range(replicas)) - gone)[:replicas]
    free = (i for i in range(replicas + len(gone) + len(kept)) if i not in kept)
    return sorted(kept + [next(free) for _ in range(replicas - len(kept))])


def index_of(worker: str) -> int:
    """The index of a worker named ``worker-3`` or ``<runtime>-worker-3``. Raises ``ValueError``
    for any other name."""
    head, sep, tail = worker.rpartition("-")
    if not sep or not head.endswith("worker") or not tail.isdigit():
        raise ValueError(f"not a worker name: {worker!r} (expected worker-<index>)")
    return int(tail)


def read(home: str, namespace: str, name: str) -> list[int] | None:
    """The stored set, or None when none is stored."""
    try:
        with open(os.path.join(runtime_dir(home, namespace, name), FILE)) as f:
            return sorted(int(i) for i in json.load(f))
    except FileNotFoundError:
        return None


def desired(home: str, namespace: str, name: str, replicas: int) -> list[int]:
    """The indexes to run for ``replicas`` workers: the stored set adapted by :func:`plan`."""
    return plan(replicas, read(home, namespace, name))


def write(home: str, namespace: str, name: str, indexes: Iterable[int]) -> None:
    """Store the set atomically."""
    directory = private.makedirs(runtime_dir(home, namespace, name))
    tmp = private.touch(os.path.join(directory, FILE + ".tmp"))
    with open(tmp, "w") as f:
        json.dump(sorted(indexes), f)
    os.replace(tmp, os.path.join(directory, FILE))


def forget(home: str, namespace: str, name: str) -> None:
    """Drop the stored set (the runtime went back to one in-process cache, or away)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(runtime_dir(home, namespace, name), FILE))
