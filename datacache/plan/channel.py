"""The plan channel: how a plan reaches every process reading the dataset on this node.

A plan is a file, ``<dataset dir>/plans/rank-<R>.json`` under ``$DATACACHE_HOME`` (one per rank
of the job; mode 0600), written to a temporary name and renamed over the old one, so a reader
sees the old plan or the new one whole, never a part. Readers (the FUSE daemon, each
``datacache://`` client in each DataLoader worker process) look for changes when a file is
opened, at most once per ``POLL_S`` seconds: one ``scandir`` and a ``stat`` per plan file.

Why files and not a unix socket: a socket needs a server, and there is none for ``datacache://``
readers (every DataLoader worker opens its own client); a file needs none, reaches every process
that starts later (a worker respawned at the next epoch), survives a daemon restart, lets ranks
publish without talking to each other, and is read with ``cat``. The cost is the poll: a plan is
seen up to ``POLL_S`` seconds late, which is nothing against an epoch. Several nodes: each rank
publishes on its own node (its share), and each node's readers read that node's plans.

Beside the plans, the readers coordinate through two more kinds of file there: one process per
plan and node prefetches (it holds ``.prefetch-<R>.lock``'s ``flock``, :func:`claim_prefetch`),
and each reading process reports its position in ``.pos-<R>-<pid>`` (:func:`share_position`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time

from datacache import private
from datacache.plan.plan import Plan

POLL_S = 0.05  # seconds between two looks at the plan directory (and two position reports: prefetch goes by them)
STALE_S = 5.0  # a process that has not reported its position for this long no longer reads


def plan_dir(dataset_dir: str) -> str:
    """The directory of a dataset's plans (``dataset_dir``: its ``layout.dataset_dir``)."""
    return os.path.join(dataset_dir, "plans")


def publish(dataset_dir: str, plan: Plan) -> str:
    """Write ``plan`` as rank ``plan.rank``'s plan, replacing the one before (atomically);
    returns the file's path. Raises ``OSError`` when the directory cannot be written."""
    directory = private.makedirs(plan_dir(dataset_dir))
    doc = {"dataset": plan.dataset, "epoch": plan.epoch, "rank": plan.rank, "world": plan.world,
           "created": time.time(), "paths": list(plan.paths)}
    fd, tmp = tempfile.mkstemp(prefix=".plan-", dir=directory)  # 0600
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, separators=(",", ":"))
        path = os.path.join(directory, f"rank-{plan.rank}.json")
        os.replace(tmp, path)
        _drop_positions(directory, plan.rank)  # the positions in the plan replaced
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def share_position(dataset_dir: str, plan: Plan, position: int) -> int | None:
    """Report this process's ``position`` in ``plan`` (when it has read some of it) and return
    the slowest position reported for that plan (the same ``created`` stamp) by the processes of
    the node that reported in the last ``STALE_S`` seconds (None: none): the job's DataLoader
    workers each read a part of the plan at their own pace, and a file one has passed another
    may still need. A process that stops reading (its share done, or gone) stops reporting and
    ages out. One small file per process, ``plans/.pos-<rank>-<pid>``, replaced atomically;
    :func:`publish` removes the old ones."""
    directory = plan_dir(dataset_dir)
    prefix = f".pos-{plan.rank}-"
    stamp = repr(plan.created)
    if position >= 0:
        fd, tmp = tempfile.mkstemp(prefix=".tmp-pos-", dir=directory)
        with os.fdopen(fd, "w") as f:
            f.write(f"{stamp} {position}")
        os.replace(tmp, os.path.join(directory, f"{prefix}{os.getpid()}"))
    fresh = time.time() - STALE_S
    slowest = None
    for name in os.listdir(directory):
        if name.startswith(prefix):
            with contextlib.suppress(OSError, ValueError):
                path = os.path.join(directory, name)
                with open(path) as f:
                    their_stamp, their_position = f.read().split()
                if their_stamp == stamp and os.stat(path).st_mtime >= fresh:
                    slowest = int(their_position) if slowest is None else min(slowest, int(their_position))
    return slowest


def _drop_positions(directory: str, rank: int) -> None:
    for name in os.listdir(directory):
        if name.startswith(f".pos-{rank}-"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, name))


def withdraw(dataset_dir: str, rank: int | None = None) -> int:
    """Remove rank ``rank``'s plan (None: every rank's); returns how many were removed. Without
    a plan, prefetch stops and eviction is LRU again."""
    removed = 0
    for name in _plan_names(plan_dir(dataset_dir)):
        if rank is None or name == f"rank-{rank}.json":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(plan_dir(dataset_dir), name))
                removed += 1
            _drop_positions(plan_dir(dataset_dir), int(name[len("rank-"):-len(".json")]))
    return removed


def claim_prefetch(dataset_dir: str, rank: int) -> int | None:
    """Become the process of this node that prefetches rank ``rank``'s plan: a file descriptor
    holding ``plans/.prefetch-<rank>.lock``'s exclusive ``flock`` (close it to give the role
    up; the kernel drops it when the process dies), or None when another process has it. One
    prefetcher per plan and node: the job's other processes (DataLoader workers) would only
    queue behind its fills. Raises ``OSError`` when the directory cannot be written."""
    path = os.path.join(private.makedirs(plan_dir(dataset_dir)), f".prefetch-{rank}.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, private.FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _plan_names(directory: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(directory) if n.startswith("rank-") and n.endswith(".json"))
    except FileNotFoundError:
        return []


def read_plan(path: str) -> Plan | None:
    """The plan in file ``path``, or None when it is gone or not a plan (a log line says nothing:
    a half-written file cannot be seen, see :func:`publish`)."""
    try:
        with open(path) as f:
            doc = json.load(f)
        return Plan(doc["dataset"], tuple(doc["paths"]), doc["epoch"], doc["rank"], doc["world"], doc["created"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class PlanWatcher:
    """The plans published for one dataset, re-read when their files change.

    :meth:`poll` returns ``(changed, plans)``: ``plans`` by rank; ``changed`` True when a plan
    appeared, was replaced or was withdrawn since the last poll that looked. It looks at most
    once per ``interval`` seconds."""

    def __init__(self, dataset_dir: str, interval: float = POLL_S):
        self.directory = plan_dir(dataset_dir)
        self.interval = interval
        self.looked = float("-inf")  # monotonic time of the last look
        self._stamps: dict[str, tuple] = {}
        self.plans: dict[int, Plan] = {}

    def poll(self) -> tuple[bool, dict[int, Plan]]:
        now = time.monotonic()
        if now - self.looked < self.interval:
            return False, self.plans
        self.looked = now
        stamps = {}
        for name in _plan_names(self.directory):
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(os.path.join(self.directory, name))
                stamps[name] = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamps == self._stamps:
            return False, self.plans
        self._stamps = stamps
        plans = {}
        for name in stamps:
            plan = read_plan(os.path.join(self.directory, name))
            if plan is not None:
                plans[plan.rank] = plan
        self.plans = plans
        return True, plans
