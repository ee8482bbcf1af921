"""A cache worker process: its store, UFS and peers assembled from the stored resources.

:class:`datacache.cluster.worker.Worker` knows blocks and HTTP, not resources or directories;
this module reads the runtime bound to the Dataset, opens the worker's own cache
(``<level path>/<ns>/<name>/worker-<i>``, :mod:`.layout`) and the UFS through the same
:class:`~datacache.stack.readpath.ReadPath` readers use, and runs it.
"""

from __future__ import annotations

import asyncio

from datacache.cache.blocks import file_id
from datacache.cluster import auth
from datacache.cluster.worker_client import WorkerClient
from datacache.cluster.membership import Membership, open_membership
from datacache.cluster.peers import Peers
from datacache.cluster.routing import Router
from datacache.cluster.store import ServingDiskTier
from datacache.cluster.worker import PEER_TIMEOUT_S, Worker, run_worker
from datacache.errors import ResourceError
from datacache.manifest import Manifest
from datacache.plan.ranking import PlanRanking
from datacache.stack import layout
from datacache.stack.readpath import ReadPath
from datacache.state import StateStore


def current_manifest(home: str, namespace: str, name: str) -> Manifest | None:
    """Dataset ``namespace/name``'s current manifest at ``home``, or None when it has none (no
    manifest, or no Dataset)."""
    state = StateStore(home)
    try:
        paths = ReadPath(home, state)
        return paths.load_manifest(paths.get("Dataset", name, namespace))
    except ResourceError:
        return None
    finally:
        state.close()


def current_files(home: str, namespace: str, name: str, block_size: int) -> set[str] | None:
    """File ids of dataset ``namespace/name``'s current manifest at ``home`` (blocks cut at
    ``block_size`` bytes), or None when it has none (no manifest, or no Dataset)."""
    manifest = current_manifest(home, namespace, name)
    if manifest is None:
        return None
    return {file_id(e.mount, e.ufs_path, e.version, block_size) for e in manifest}


def serve(home: str, namespace: str, name: str, index: int, host: str = "127.0.0.1", port: int = 0,
          advertise: str | None = None, exit_with_parent: bool = False) -> None:
    """Run worker ``index`` of the CacheRuntime (or ThinRuntime, whose UFS its profile's plugin or
    FUSE command opens) ``namespace/name`` until SIGTERM/SIGINT.

    Its cache lives in ``<level path>/<ns>/<name>/worker-<index>``; it listens on ``host:port``
    (0: any free port) and registers ``http://<advertise or host>:<port>`` with a heartbeat.
    Raises ``ResourceError`` when the Dataset, CacheRuntime or token is missing, ``OSError`` when
    the port or cache directory cannot be used.
    """
    state = StateStore(home)
    try:
        paths = ReadPath(home, state)
        dataset = paths.get("Dataset", name, namespace)
        runtime = paths.runtime_for(dataset) or paths.get("CacheRuntime", name, namespace)  # a ThinRuntime too
        worker_id = f"worker-{index}"
        token = auth.load_token(home, namespace, name)
        store = paths.store_for(runtime, worker_id, ServingDiskTier)
        router = Router(open_membership(home), namespace, name, short_circuit=False, strict=False)
        block_size = runtime.spec.block_size_bytes
        peers = Peers(worker_id, router, WorkerClient(token, name, block_size, read_timeout=PEER_TIMEOUT_S))
        worker = Worker(name, block_size, store, paths.ufs_for(dataset, runtime), token, worker_id,
                        peers=peers, current_files=lambda: current_files(home, namespace, name, block_size))
        ranking = PlanRanking(layout.dataset_dir(home, namespace, name), name,
                              lambda: current_manifest(home, namespace, name), block_size)
        store.rank_victims_by(ranking)  # disk levels evict by the node's plans (LRU without one)
    finally:
        state.close()
    members = Membership(home)
    try:
        asyncio.run(run_worker(worker, members, namespace, name, host, port, advertise or host, exit_with_parent))
    finally:
        worker.close()
        members.close()
