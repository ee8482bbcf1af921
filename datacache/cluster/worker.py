"""The cache worker: one process serving one share of a dataset's blocks over HTTP (aiohttp).

Endpoints (all but ``/healthz`` and ``/metrics`` need ``Authorization: Bearer <token>``):

| endpoint            | what it does                                                                  |
|---------------------|-------------------------------------------------------------------------------|
| ``GET /v1/block``   | one block by file-version fields + index; a MEM hit is sent from memory, a    |
|                     | disk hit with ``sendfile`` straight from the block file, a miss is copied     |
|                     | from a peer holding it (read-repair, :mod:`.peers`), else filled from the UFS |
| ``GET /v1/block``   | with ``key=`` instead: the block if held (checksum verified), else 404; never |
|                     | fills (how peers look for blocks away from home)                              |
| ``POST /v1/exists`` | ``{"dataset", "keys": [...]}`` -> ``{"cached": [bool, ...]}``                 |
| ``POST /v1/fill``   | ``{"dataset", "block_size", "files": [{fields, "blocks": [i...]}]}``: fill the|
|                     | blocks (warmup, copying what peers hold), answer per file ``{"stored": bytes, |
|                     | "ufs": bytes read from the UFS}`` or ``{"error": ...}``; ``"check": true``    |
|                     | verifies the checksums of blocks held (``warmup --check``)                    |
| ``POST /v1/verify`` | ``{"dataset", "keys": [...]}`` -> ``{"checked": [null|true|false, ...]}``: each |
|                     | block held is read and checked against its checksum, a failing one dropped    |
|                     | (``datacache verify``); null: not held here                                   |
| ``POST /v1/pull``   | ``{"dataset", "from", "keys"}``: copy blocks this worker owns from worker     |
|                     | ``from`` (hand-off); ``{"held": [bool, ...]}``                                |
| ``POST /v1/drain``  | ``{"dataset", "seconds"}``: hand every block of the dataset's current files   |
|                     | to its owner among the other live workers, dropping the copies, for at most   |
|                     | ``seconds`` (before a scale-in stops this worker, see :meth:`.Peers.drain`); |
|                     | ``{"drain": {"blocks", "moved", "left", "stale", "seconds", "errors"}}``      |
|                     | From then on the worker stores nothing: a miss is served from a peer or the   |
|                     | UFS without keeping it, pulls are refused, fills answer 503 (clients fail     |
|                     | over), so the drain can end with no current block left on this worker.        |
| ``POST /v1/drop``   | ``{"dataset"}``: delete every block of the dataset                            |
| ``GET /healthz``    | ``{"worker", "dataset", "status": "ok"}``                                     |
| ``GET /metrics``    | Prometheus text (see :mod:`.metrics`)                                         |

The API is served on TCP and, for clients on the same node, on an abstract Unix socket named after
the TCP address (:func:`.transport.local_address`; the same endpoints and token).

A disk hit is not copied into MEM on its way out: with sendfile the kernel's page cache already
keeps hot block files in memory, and copying them through Python would cost more than it saves;
MEM serves blocks the store promoted (second access through the checked path) and MEM-only
runtimes. Block responses carry ``X-Block-Checksum`` (xxh3 of the bytes; the client verifies it) and
``X-Cache: hit|miss``. Fills reuse :class:`~datacache.cache.local_source.LocalBlockSource` unchanged
(single-flight per block, one memory budget, exact-version ranged reads); demand fills run in a
pool of ``fill_threads`` threads, which bounds this worker's concurrent UFS connections. Every
request field is validated by :mod:`.wire` before the store or the UFS is touched. A fill answer
starts at once and carries a space every ``KEEPALIVE_S`` seconds until its JSON is ready (JSON
allows leading whitespace), so clients bound every call by a short read timeout and still tell a
long fill from a stalled worker.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from aiohttp import web

from datacache.cache.blocks import BlockKey, checksum
from datacache.cache.singleflight import SingleFlight
from datacache.cache.budget import MemoryBudget
from datacache.cache.readahead import ReadAhead
from datacache.cache.memory import MemoryTier
from datacache.cache.local_source import LocalBlockSource
from datacache.cache.tiered import TieredStore
from datacache.cluster import auth, transport, wire
from datacache.cluster.member import Member
from datacache.cluster.membership import HEARTBEAT_S, Membership
from datacache.cluster.metrics import CONTENT_TYPE, WorkerMetrics
from datacache.cluster.peers import HANDOFF_BATCH, Peers
from datacache.cluster.store import ACCESS_FLUSH_S, ServingDiskTier

log = logging.getLogger("datacache.worker")

OPEN_PATHS = frozenset({"/healthz", "/metrics"})
FILL_BUDGET = 256 << 20  # bytes of fills in flight per worker
MAX_FILES = 1024
KEEPALIVE_S = 1.0  # seconds between the spaces of a fill answer still being computed
PEER_TIMEOUT_S = 5.0  # read timeout of calls to peers
SHUTDOWN_S = 2.0


class Worker:
    """Serves blocks of ``dataset`` cut at ``block_size`` bytes from ``store``, filling from ``ufs``
    (a ``UnionNamespace``). ``token``: the bearer token; ``worker_id``: ``worker-<i>``; ``peers``:
    the other workers (None: a worker alone, misses go straight to the UFS); ``current_files``:
    returns the file ids (:func:`~datacache.cache.blocks.file_id`) of the dataset's current
    manifest, or None when unknown (a drain then moves blocks of every version)."""

    def __init__(self, dataset: str, block_size: int, store: TieredStore, ufs, token: str,
                 worker_id: str = "worker-0", fill_threads: int = 16, peers: Peers | None = None,
                 current_files: Callable[[], set[str] | None] = lambda: None):
        self.dataset = dataset
        self.block_size = block_size
        self.store = store
        self.worker_id = worker_id
        self.token = token
        self.roots = {name: m.root for name, m in ufs.mounts.items()}
        self.source = LocalBlockSource(dataset, store, ufs, block_size,
                                       ReadAhead(MemoryBudget(FILL_BUDGET), block_size))
        self._fills = ThreadPoolExecutor(fill_threads, thread_name_prefix="worker-fill")
        self._mem = next((lv for lv in store.levels if isinstance(lv, MemoryTier)), None)
        self._disk = next((lv for lv in store.levels if isinstance(lv, ServingDiskTier)), None)
        self.peers = peers
        self.current_files = current_files
        self.peer_bytes = 0  # bytes copied in from peers (read-repair and hand-off)
        self._writes = 0  # store writes in flight (fills, copies from peers): a drain waits for them
        self._misses = SingleFlight()
        self.metrics = WorkerMetrics(self)

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application(middlewares=[self._timed, auth.middleware(self.token, OPEN_PATHS), self._errors],
                              client_max_size=16 << 20)
        app.router.add_get("/v1/block", self.get_block)
        app.router.add_post("/v1/exists", self.exists)
        app.router.add_post("/v1/verify", self.verify)
        app.router.add_post("/v1/fill", self.fill)
        app.router.add_post("/v1/pull", self.pull)
        app.router.add_post("/v1/drain", self.drain)
        app.router.add_post("/v1/drop", self.drop)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/metrics", self.metrics_page)
        return app

    # -- middlewares ----------------------------------------------------------------------------
    @web.middleware
    async def _timed(self, request: web.Request, handler):
        started = time.perf_counter()
        try:
            return await handler(request)
        finally:
            route = request.match_info.route.resource
            endpoint = route.canonical if route is not None else "other"  # bounded label values
            self.metrics.latency.labels(endpoint).observe(time.perf_counter() - started)

    @web.middleware
    async def _errors(self, request: web.Request, handler):
        try:
            return await handler(request)
        except wire.BadRequest as err:
            return web.json_response({"error": "BadRequest", "message": str(err)}, status=400)
        except wire.WrongDataset as err:
            return web.json_response({"error": "WrongDataset", "message": str(err)}, status=409)

    # -- handlers ---------------------------------------------------------------------------------
    async def get_block(self, request: web.Request) -> web.StreamResponse:
        query = request.query
        if "key" in query:
            return await self._get_by_key(query)
        wire.check_scope(query, self.dataset, self.block_size)
        entry = wire.parse_entry(query, self.roots)
        index = wire.parse_index(query, entry, self.block_size)
        key = str(self.source.key(entry, index))
        transport.widen_send_buffer(request.transport)
        if query.get("verify") != "1":  # fast paths; verify=1 re-reads through the checked store
            data = self._mem.get(key) if self._mem is not None else None
            if data is not None:
                self.metrics.hits.inc()
                return _block_response(data, checksum(data), True)
            found = self._disk.open_block(key) if self._disk is not None else None
            if found is not None:
                self.metrics.hits.inc()
                with found[0] as f:
                    return await _send_block_file(request, f, *found[1:])
        try:
            data, hit = await self._single_flight(key, self._fetch_missing, entry, index, key)
        except OSError as err:
            return web.json_response(wire.error_body(err), status=wire.UFS_ERROR_STATUS)
        (self.metrics.hits if hit else self.metrics.misses).inc()
        return _block_response(data, checksum(data), hit)

    async def _get_by_key(self, query) -> web.Response:
        wire.check_scope(query, self.dataset)
        (key,) = self._keys([query.get("key")])
        data = await asyncio.get_running_loop().run_in_executor(None, self.store.get, key)  # verified
        if data is None:
            return web.json_response({"error": "NotFound", "message": "block not held here"}, status=404)
        return _block_response(data, checksum(data), True)

    async def exists(self, request: web.Request) -> web.Response:
        body = await _json(request)
        wire.check_scope(body, self.dataset)
        keys = self._keys(wire.parse_key_list(body))
        cached = await asyncio.get_running_loop().run_in_executor(None, lambda: [k in self.store for k in keys])
        return web.json_response({"cached": cached})

    async def verify(self, request: web.Request) -> web.StreamResponse:
        body = await _json(request)
        wire.check_scope(body, self.dataset)
        keys = self._keys(wire.parse_key_list(body))
        work = asyncio.to_thread(lambda: [self.store.check(k) for k in keys])  # reads every block held: slow
        return await _slow_json(request, work, "checked")

    async def pull(self, request: web.Request) -> web.Response:
        body = await _json(request)
        wire.check_scope(body, self.dataset)
        keys = self._keys(wire.parse_key_list(body, HANDOFF_BATCH))
        holder = wire.parse_worker_id(body, "from")
        if self.peers is not None:
            await self.peers.view()  # owns() below reads it from the router's cache
        held = []
        for key in keys if not self.draining else ():  # a leaving worker takes no block
            if self.peers is not None and not self.peers.recall(key):  # being dropped: asked again later
                held.append(False)
                continue
            ok = await asyncio.get_running_loop().run_in_executor(None, self.store.__contains__, key)
            if not ok and self.peers is not None and self.peers.owns(key):
                data = await self.peers.pull_from(holder, key)
                ok = data is not None and await self._keep(key, data)
            held.append(bool(ok))
        return web.json_response({"held": held + [False] * (len(keys) - len(held))})

    async def fill(self, request: web.Request) -> web.StreamResponse:
        body = await _json(request)
        wire.check_scope(body, self.dataset, self.block_size)
        if self.draining:  # out of placement: the client's next-ranked worker fills these
            return web.json_response({"error": "Draining", "message": f"{self.worker_id} is being drained"},
                                     status=503)
        files = body.get("files")
        check, bulk = body.get("check", False), body.get("bulk", False)
        for name, flag in (("check", check), ("bulk", bulk)):
            if not isinstance(flag, bool):
                raise wire.BadRequest(f"{name}: expected true or false")
        if not isinstance(files, list) or not 0 < len(files) <= MAX_FILES:
            raise wire.BadRequest(f"files: expected a list of 1 to {MAX_FILES} files")
        jobs = []
        for f in files:
            if not isinstance(f, dict):
                raise wire.BadRequest("files: each file is an object")
            entry = wire.parse_entry(f, self.roots)
            blocks = f.get("blocks")
            if not isinstance(blocks, list) or not 0 < len(blocks) <= wire.MAX_KEYS:
                raise wire.BadRequest("blocks: expected a non-empty list of block indexes")
            indexes = sorted({wire.parse_index({"i": i}, entry, self.block_size, "i") for i in blocks})
            jobs.append(self._fill_file(entry, indexes, check, bulk))
        return await _slow_json(request, asyncio.gather(*jobs), "results")

    async def drain(self, request: web.Request) -> web.StreamResponse:
        body = await _json(request)
        wire.check_scope(body, self.dataset)
        seconds = wire.parse_seconds(body)
        if self.peers is None or self._disk is None:  # alone, or MEM only: nothing kept to hand off
            report = {"blocks": 0, "moved": 0, "left": 0, "stale": 0, "seconds": 0.0, "errors": {}}
            return web.json_response({"drain": report})
        self.peers.draining = True  # before listing: nothing is stored from now on
        current = await asyncio.to_thread(self.current_files)
        work = self.peers.drain(lambda: self._drain_keys(current)[0], self._disk.discard,
                                lambda: self._writes == 0, seconds)
        return await _slow_json(request, _with_stale(work, lambda: self._drain_keys(current)[1]), "drain")

    @property
    def draining(self) -> bool:
        """Whether this worker is being drained (it stores nothing then)."""
        return self.peers is not None and self.peers.draining

    def _drain_keys(self, current: set[str] | None) -> tuple[list[str], int]:
        """``(keys of the dataset's ``current`` files held on disk, count of other versions'
        blocks)`` (``current`` None: every key counts); old versions are not moved: no read asks
        for them again (blocks are version-addressed)."""
        prefix = f"{self.dataset}/"
        keys = [k for k in self._disk.keys() if k.startswith(prefix)]
        if current is None:
            return keys, 0
        kept = [k for k in keys if BlockKey.parse(k).file_id in current]
        return kept, len(keys) - len(kept)

    async def drop(self, request: web.Request) -> web.Response:
        body = await _json(request)
        wire.check_scope(body, self.dataset)
        dropped = await asyncio.get_running_loop().run_in_executor(None, self.store.delete_prefix, f"{self.dataset}/")
        return web.json_response({"dropped": dropped})

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"worker": self.worker_id, "dataset": self.dataset, "status": "ok"})

    async def metrics_page(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    # -- internals --------------------------------------------------------------------------------
    def _keys(self, keys: list) -> list[str]:
        """``keys`` checked to be block keys of this dataset (BadRequest naming the first that is not)."""
        for k in keys:
            try:
                parsed = BlockKey.parse(k) if isinstance(k, str) else None
            except ValueError:
                parsed = None
            if parsed is None:
                raise wire.BadRequest(f"keys: {str(k)[:80]!r} is not a block key")
            if parsed.dataset != self.dataset:
                raise wire.BadRequest(f"keys: {k[:80]!r} is not a block of dataset {self.dataset!r}")
        return keys

    async def _single_flight(self, key: str, fn, *args):
        """``await fn(*args)``, shared by every request for ``key`` while it runs (a request
        that goes away cancels only its own wait)."""
        fut, mine = self._misses.claim(key)
        if mine:
            task = asyncio.ensure_future(fn(*args))
            task.add_done_callback(lambda t: self._misses.settle(key, fut, *_outcome(t)))
        return await asyncio.shield(asyncio.wrap_future(fut))

    async def _fetch_missing(self, entry, index: int, key: str) -> tuple[bytes, bool]:
        """A block not in MEM or on disk: from a peer holding it (a hit for the cluster), else the
        store or the UFS (``(bytes, hit)``)."""
        if self.peers is not None and key not in self.store:
            data = await self.peers.find(key)
            if data is not None:
                await self._keep(key, data)
                return data, True
        if self.draining:  # served, not kept: the drain must end with nothing left here
            return await asyncio.get_running_loop().run_in_executor(self._fills, self.source.uncached, entry,
                                                                    index), False
        hit = key in self.store
        return await self._in_pool(self.source.get, entry, index), hit

    async def _keep(self, key: str, data: bytes) -> bool:
        """Store a block copied from a peer; whether the store kept it (never while draining)."""
        if self.draining:
            return False
        self._writes += 1
        try:
            kept = await asyncio.get_running_loop().run_in_executor(None, self.store.put, key, data)
        finally:
            self._writes -= 1
        if kept:
            self.peer_bytes += len(data)
        return kept

    async def _fill_file(self, entry, indexes: list[int], check: bool = False, bulk: bool = False) -> dict:
        """Copy what peers hold of blocks ``indexes``, fill contiguous runs of the rest concurrently
        from the UFS (``check``: blocks held here are verified by checksum first; ``bulk``: written
        around the page cache; see :meth:`LocalBlockSource.fill`); ``{"stored": bytes, "ufs": bytes}``
        or the first error."""
        copied = 0
        if self.peers is not None:
            keys = [str(self.source.key(entry, i)) for i in indexes]
            missing = await asyncio.get_running_loop().run_in_executor(
                None, lambda: [k for k in keys if k not in self.store])
            for key, data in (await self.peers.find_many(missing)).items():
                if await self._keep(key, data):
                    copied += len(data)
        runs = _runs(indexes)
        done = await asyncio.gather(*(self._in_pool(self.source.fill, entry, a, b, check, bulk) for a, b in runs),
                                    return_exceptions=True)
        ufs = sum(r for r in done if isinstance(r, int))
        for result in done:
            if isinstance(result, OSError):
                return {"error": wire.error_body(result), "stored": copied + ufs, "ufs": ufs}
            if isinstance(result, BaseException):
                raise result
        return {"stored": copied + ufs, "ufs": ufs}

    async def _in_pool(self, fn, *args):
        self.metrics.fills_in_flight.inc()
        self._writes += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._fills, fn, *args)
        finally:
            self._writes -= 1
            self.metrics.fills_in_flight.dec()

    def close(self) -> None:
        if self._disk is not None:
            self._disk.flush_accesses()
        self._fills.shutdown(wait=True, cancel_futures=True)
        self.source.close()


async def _slow_json(request: web.Request, work, field: str) -> web.StreamResponse:
    """Answer ``{field: await work}``, sending a space every ``KEEPALIVE_S`` seconds until then."""
    task = asyncio.ensure_future(work)
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    try:
        await resp.prepare(request)
        while not (await asyncio.wait({task}, timeout=KEEPALIVE_S))[0]:
            await resp.write(b" ")
        await resp.write(json.dumps({field: task.result()}).encode())
        await resp.write_eof()
    except ConnectionResetError:  # the client gave up (its timeout): what is being filled still lands
        await task
    return resp


async def _with_stale(work, stale) -> dict:
    """``await work`` (a drain report) with ``"stale": stale()`` (blocks of old versions left)."""
    report = await work
    return {**report, "stale": await asyncio.to_thread(stale)}


async def _send_block_file(request: web.Request, f, offset: int, size: int, digest: str) -> web.StreamResponse:
    """A disk hit: ``size`` bytes at ``offset`` of the open cache file ``f`` sent with ``sendfile``.
    What aiohttp's FileResponse does after its stat/open/conditional-header work in an executor
    (~0.4 ms a request here), which a block (opened by the index lookup, never revalidated by
    clients) needs none of."""
    resp = web.StreamResponse(headers={"X-Block-Checksum": digest, "X-Cache": "hit", "Content-Length": str(size),
                                       "Content-Type": "application/octet-stream"})
    await resp.prepare(request)  # a StreamResponse sends its headers here, before the file
    await asyncio.get_running_loop().sendfile(request.transport, f, offset, size)
    await resp.write_eof()
    return resp


def _block_response(data: bytes, digest: str, hit: bool) -> web.Response:
    return web.Response(body=data, content_type="application/octet-stream",
                        headers={"X-Block-Checksum": digest, "X-Cache": "hit" if hit else "miss"})


async def _json(request: web.Request) -> dict:
    try:
        body = await request.json()
    except ValueError:
        raise wire.BadRequest("body: expected a JSON object") from None
    if not isinstance(body, dict):
        raise wire.BadRequest("body: expected a JSON object")
    return body


def _runs(indexes: list[int]) -> list[tuple[int, int]]:
    """Sorted indexes -> inclusive ``(first, last)`` runs of consecutive numbers."""
    runs: list[tuple[int, int]] = []
    for i in indexes:
        if runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def disk_info(store: TieredStore) -> dict:
    """The registered description of a store's disk level (for short-circuit readers)."""
    disk = next((lv for lv in store.levels if isinstance(lv, ServingDiskTier)), None)
    if disk is None:
        return {}
    return {"path": disk.path, "quota": disk.quota, "medium": disk.medium}


async def run_worker(worker: Worker, members: Membership, namespace: str, runtime: str, host: str, port: int,
                     advertise: str, exit_with_parent: bool) -> None:
    """Serve ``worker`` of runtime ``namespace/runtime`` on ``host:port`` (0: any free port) and on
    its same-node socket, registered in ``members`` as ``http://<advertise>:<port>`` with a
    heartbeat, until SIGTERM/SIGINT (or its parent's exit with ``exit_with_parent``). Raises
    ``OSError`` when the port cannot be used."""
    background = []
    if worker._disk is not None:
        background.append(asyncio.ensure_future(_every(ACCESS_FLUSH_S, worker._disk.flush_accesses)))
    if worker.peers is not None and worker._disk is not None:
        disk, prefix = worker._disk, f"{worker.dataset}/"
        background.append(asyncio.ensure_future(worker.peers.run_handoff(
            lambda: [k for k in disk.keys() if k.startswith(prefix)], disk.discard)))
    # A stopping worker waits SHUTDOWN_S at most for requests in flight (clients fail over).
    runner = web.AppRunner(worker.app(), access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_S)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    bound = runner.addresses[0][1]
    url = f"http://{advertise}:{bound}"
    local = transport.listen_local(url)  # same-node clients: the same API without the TCP stack
    if local is not None:
        await web.SockSite(runner, local).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    me = Member(worker.worker_id, url, socket.gethostname(), os.getpid(),
                disk_info(worker.store))
    members.register(namespace, runtime, me)
    log.info("worker %s of %s/%s serving on %s", me.worker_id, namespace, runtime, me.url)
    parent = os.getppid()
    try:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), HEARTBEAT_S)
            except asyncio.TimeoutError:
                pass
            if exit_with_parent and os.getppid() != parent:
                log.warning("supervisor %d is gone: stopping", parent)
                break
            if not members.heartbeat(namespace, runtime, me.worker_id, me.pid):
                members.register(namespace, runtime, me)
    finally:
        for task in background:
            task.cancel()
        members.remove(namespace, runtime, me.worker_id, me.pid)
        await runner.cleanup()
        if worker.peers is not None:
            await worker.peers.close()


async def _every(seconds: float, fn) -> None:
    """Run ``fn()`` in a thread every ``seconds`` seconds, forever (errors logged)."""
    while True:
        await asyncio.sleep(seconds)
        try:
            await asyncio.to_thread(fn)
        except Exception:
            log.exception("%s failed", getattr(fn, "__name__", fn))


def _outcome(task: asyncio.Future) -> tuple:
    """``(result, error)`` of a finished task, for :meth:`SingleFlight.settle`."""
    if task.cancelled():
        return None, asyncio.CancelledError()
    return task.result() if task.exception() is None else None, task.exception()
