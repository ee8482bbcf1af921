"""Helpers for the cluster tests: runtimes with N workers, what the workers really store, and
cleaning up every process a test started."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import urllib.request

from datacache.api.loader import load_resource_dict
from datacache.cache.budget import MemoryBudget
from datacache.cache.blocks import block_count, block_range, file_id
from datacache.cache.disk import DiskTier
from datacache.dataset_client import DatasetClient
from datacache.cluster.member import Member
from datacache.cluster.membership import Membership
from datacache.cluster.worker_source import connect
from datacache.control import supervisor
from datacache.control.embedded import Embedded
from support import disk_keys, wait_for  # noqa: F401 - wait_for is this directory's helper too

MiB = 1 << 20


def runtime_docs(name: str, mounts: list[dict], levels: list[dict], replicas: int, block_size: str) -> list:
    ds = {"apiVersion": "datacache.io/v1alpha1", "kind": "Dataset", "metadata": {"name": name},
          "spec": {"mounts": mounts}}
    rt = {"apiVersion": "datacache.io/v1alpha1", "kind": "CacheRuntime", "metadata": {"name": name},
          "spec": {"replicas": replicas, "blockSize": block_size, "tieredstore": {"levels": levels}}}
    return [load_resource_dict(ds, "test"), load_resource_dict(rt, "test")]


def apply_cluster(home, name: str, mounts: list[dict], levels: list[dict] | None = None, replicas: int = 3,
                  block_size: str = "256Ki") -> Embedded:
    """Apply a Dataset and a CacheRuntime with ``replicas`` workers; returns the plane once they are ready."""
    levels = levels or [{"mediumtype": "SSD", "path": "cache", "quota": "256Mi"}]
    plane = Embedded(str(home))
    lines = plane.apply(runtime_docs(name, mounts, levels, replicas, block_size))
    assert all("ready" not in line for line in lines), lines
    return plane


def write_files(root, sizes: dict[str, int]) -> dict[str, bytes]:
    """Random files under ``root``; returns name -> bytes."""
    out = {}
    for name, size in sizes.items():
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = os.urandom(size)
        with open(path, "wb") as f:
            f.write(data)
        out[name] = data
    return out


def live(home, name: str) -> dict[str, Member]:
    members = Membership(str(home))
    try:
        return {m.worker_id: m for m in members.live("default", name)}
    finally:
        members.close()


def worker_metrics(home, name: str) -> dict[str, dict[str, float]]:
    """Each live worker's Prometheus samples (``/metrics`` needs no token), by worker id."""
    from datacache.cluster.metrics import parse

    out = {}
    for wid, m in live(home, name).items():
        with urllib.request.urlopen(m.url + "/metrics", timeout=5) as resp:
            out[wid] = parse(resp.read().decode())
    return out




def kill_worker(home, name: str, worker_id: str) -> Member:
    """SIGKILL a worker; returns its member row."""
    member = live(home, name)[worker_id]
    os.kill(member.pid, signal.SIGKILL)
    return member


def wait_restarted(home, name: str, old: Member, timeout: float = 30.0) -> Member:
    return wait_for(lambda: next((m for m in live(home, name).values()
                                  if m.worker_id == old.worker_id and m.pid != old.pid), None),
                    timeout, f"{old.worker_id} to come back")


def worker_dirs(home, name: str) -> dict[str, str]:
    base = os.path.join(str(home), "cache", "default", name)
    return {d: os.path.join(base, d) for d in sorted(os.listdir(base)) if d.startswith("worker-")}


def stored_keys(home, name: str) -> dict[str, set[str]]:
    """Block keys on each worker's disk, read from the cache directories themselves."""
    return {worker: disk_keys(path) for worker, path in worker_dirs(home, name).items()}


def block_bytes(manifest, block_size: int, dataset: str) -> dict[str, int]:
    """Every current-version block key of ``manifest`` -> its size in bytes."""
    out = {}
    for e in manifest:
        fid = file_id(e.mount, e.ufs_path, e.version, block_size)
        for i in range(block_count(e.size, block_size)):
            a, b = block_range(i, e.size, block_size)
            out[f"{dataset}/{fid}/{i}"] = b - a
    return out


def open_client(plane: Embedded, name: str, **options) -> DatasetClient:
    """Like ``plane.open_dataset`` with ClusterBlockSource options (short_circuit, timeouts)."""
    client = plane.open_dataset(name)
    if options:
        client.source.close()
        runtime = plane.get("CacheRuntime", name)
        client.source = connect(plane.home, runtime, client.ufs, MemoryBudget(256 * MiB), None, **options)
    return client


def corrupt_block_files(directories, key: str) -> int:
    """Overwrite the first 64 bytes of block ``key``'s file in each cache directory holding it
    (behind the cache's back); returns how many files were damaged."""
    damaged = 0
    for path in directories:
        tier = DiskTier(path, 1 << 40)
        block_file = tier.block_file(key)
        tier.close()
        if block_file:
            with open(block_file, "r+b") as f:
                f.write(b"\xff" * 64)
            damaged += 1
    return damaged


def processes_of(home) -> list[int]:
    """Pids of running processes whose command line names ``home`` (what the tests started)."""
    mine, found = str(home).encode(), []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if mine in cmd and supervisor._start_time(int(pid)) is not None:
            found.append(int(pid))
    return found


def reap(home) -> list[int]:
    """Stop every runtime under ``home`` and SIGKILL any process left; returns the leftovers."""
    home = str(home)
    for pid in processes_of(home):  # a test may have paused some (SIGSTOP)
        with contextlib.suppress(ProcessLookupError):  # it may exit between listing and signal
            os.kill(pid, signal.SIGCONT)
    runtimes = os.path.join(home, "runtimes")
    for ns in os.listdir(runtimes) if os.path.isdir(runtimes) else []:
        for name in os.listdir(os.path.join(runtimes, ns)):
            supervisor.stop(home, ns, name, timeout=15.0)  # a loaded machine exits slowly
    leftovers = processes_of(home)
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return leftovers



def disrupt_mid_read(steps, at: int, disrupt, timeout: float = 120.0) -> list:
    """Consume the iterator ``steps`` (reads) in a thread and call ``disrupt()`` once ``at`` items
    have come; returns every item. Fails if the reader raised or did not finish in ``timeout`` s."""
    got, errors, halfway = [], [], threading.Event()

    def reader():
        try:
            for item in steps:
                got.append(item)
                if len(got) == at:
                    halfway.set()
        except Exception as err:  # reported below
            errors.append(err)
        finally:
            halfway.set()

    thread = threading.Thread(target=reader)
    thread.start()
    assert halfway.wait(timeout)
    disrupt()
    thread.join(timeout)
    assert not thread.is_alive() and not errors, errors
    return got
