"""Client side of the worker API: one aiohttp session on a background event loop.

The block-source interface is synchronous (the Reader, FUSE and warmup call it from threads), so
the client owns an event loop in one daemon thread and callers wait on
``asyncio.run_coroutine_threadsafe``; a warmup segment sent to three owners is three requests in
flight on that loop, not three threads. Connections are pooled per worker. Block reads
(:meth:`WorkerClient.get_block`) are the exception: blocking calls in the caller's thread through
:mod:`.transport` (urllib3; a same-node worker over its local socket), the hot path with no hop.

Every call is bounded: ``connect_timeout`` seconds to connect and ``read_timeout`` seconds between
bytes of an answer (a worker answering a long fill sends a space every second meanwhile, so a slow
fill is not a stall). A worker that accepts connections but never answers costs one
``read_timeout``, and the error says so: ``cache worker worker-1 timed out after 10s``.

Failures are sorted by what the caller should do next:

| outcome                                                 | raised                              |
|---------------------------------------------------------|-------------------------------------|
| connect error, timeout, disconnect, 5xx                 | :class:`WorkerUnavailable`: next    |
| 404 (a block evicted while being sent), bad checksum    | :class:`BlockVanished`: retry it    |
| 400 / 409 (a field the worker refuses)                  | :class:`WorkerRejected`: skip it    |
| 401                                                     | ``PermissionError`` (EACCES)        |
| 502 with an error body (the UFS failed on the worker)   | the same OSError type and errno     |
"""

from __future__ import annotations

import asyncio
import errno
import json
import threading

import aiohttp

from datacache.cache.blocks import checksum
from datacache.cluster import auth, wire
from datacache.cluster.metrics import parse as parse_metrics
from datacache.cluster.transport import BlockTransport, TransportError
from datacache.manifest import FileEntry


class WorkerUnavailable(ConnectionError):
    """The worker did not answer usefully (dead, unreachable, slow, broken): try another."""


class BlockVanished(Exception):
    """The worker's copy disappeared or failed its checksum on the way: ask again, verified."""


class WorkerRejected(ValueError):
    """The worker refused a request field (HTTP 400/409): it cannot serve this block."""


class LoopThread:
    """An asyncio loop running in a daemon thread; :meth:`run` waits for a coroutine on it."""

    def __init__(self, name: str = "datacache-cluster-io"):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro, timeout: float | None = None):
        """Run ``coro`` on the loop and return its result (its exception is raised here)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def gather(self, coros, timeout: float | None = None) -> list:
        """Run ``coros`` concurrently on the loop; each result, or the exception it raised."""
        async def all_of():
            return await asyncio.gather(*coros, return_exceptions=True)

        return self.run(all_of(), timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class WorkerClient:
    """Requests to the workers of ``dataset`` (blocks cut at ``block_size`` bytes).

    ``token``: bearer token; ``connect_timeout``/``read_timeout``: seconds for connecting and
    between bytes of an answer. Coroutines must run on one loop (see :class:`LoopThread`).
    """

    def __init__(self, token: str, dataset: str, block_size: int, connect_timeout: float = 1.0,
                 read_timeout: float = 10.0):
        self.dataset = dataset
        self.block_size = block_size
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._headers = auth.header(token)
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=read_timeout)
        self._session: aiohttp.ClientSession | None = None
        self._blocks = BlockTransport(self._headers, connect_timeout, read_timeout)

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=256, limit_per_host=32, enable_cleanup_closed=True)
            self._session = aiohttp.ClientSession(connector=connector, headers=self._headers,
                                                  auto_decompress=False, timeout=self._timeout,
                                                  read_bufsize=self.block_size)
        return self._session

    async def _request(self, method: str, url: str, path: str, where: str, **kwargs):
        """``(status, headers, body bytes)``; connection-level failures become WorkerUnavailable."""
        try:
            async with self._http().request(method, url + path, **kwargs) as resp:
                return resp.status, resp.headers, await resp.read()
        except aiohttp.ConnectionTimeoutError as err:
            raise self._unavailable("connect", where, err) from err
        except asyncio.TimeoutError as err:  # aiohttp's SocketTimeoutError: no byte for read_timeout
            raise self._unavailable("read", where, err) from err
        except (aiohttp.ClientError, OSError) as err:
            raise self._unavailable("", where, err) from err

    def _unavailable(self, timeout: str, where: str, err: BaseException) -> WorkerUnavailable:
        if timeout == "connect":
            return WorkerUnavailable(f"cache worker {where} did not accept a connection within "
                                     f"{self.connect_timeout:g}s")
        if timeout == "read":
            return WorkerUnavailable(f"cache worker {where} timed out after {self.read_timeout:g}s")
        return WorkerUnavailable(f"cache worker {where}: {type(err).__name__}: {err}")

    @staticmethod
    def _check(status: int, body: bytes, where: str, path: str = "") -> None:
        if status < 300:
            return
        if status == 401:
            raise PermissionError(errno.EACCES, f"cache worker {where} refused the bearer token", path)
        if status in (400, 409):
            raise WorkerRejected(f"cache worker {where}: {body[:200].decode(errors='replace')}")
        if status == 404:
            raise BlockVanished(where)
        if status == wire.UFS_ERROR_STATUS:
            try:
                error = json.loads(body)
            except ValueError:
                error = None
            if isinstance(error, dict) and "errno" in error:
                wire.raise_error(error, path, where)
        raise WorkerUnavailable(f"cache worker {where}: HTTP {status}")

    def get_block(self, url: str, where: str, entry: FileEntry, index: int, verify: bool = False,
                  local: bool = False) -> tuple[bytes, bool]:
        """Block ``index`` of ``entry`` and whether it was a hit on the worker. Synchronous, in
        the caller's thread (:mod:`.transport`); ``local``: the worker runs on this node."""
        params = {"dataset": self.dataset, "block_size": str(self.block_size), "index": str(index),
                  **{k: str(v) for k, v in wire.entry_fields(entry).items()}}
        if verify:
            params["verify"] = "1"
        try:
            status, headers, body = self._blocks.get(url, "/v1/block", params, local)
        except TransportError as err:
            raise self._unavailable(err.timeout, where, err) from err
        self._check(status, body, where, entry.path)
        expected = headers.get("X-Block-Checksum")
        if expected is None or checksum(body) != expected:
            raise BlockVanished(where)
        return body, headers.get("X-Cache") == "hit"

    async def get_key(self, url: str, where: str, key: str) -> bytes | None:
        """Block ``key`` (``str(BlockKey)``) if the worker holds it, else None: the worker neither
        fills it nor asks its peers (used by workers to find blocks away from home)."""
        status, headers, body = await self._request("GET", url, "/v1/block", where,
                                                     params={"dataset": self.dataset, "key": key})
        if status == 404:
            return None
        self._check(status, body, where)
        return body if checksum(body) == headers.get("X-Block-Checksum") else None  # damaged on the way

    async def pull(self, url: str, where: str, holder: str, keys: list[str]) -> list[bool]:
        """Ask the worker (the owner of ``keys``) to copy them from worker ``holder``; per key,
        whether the owner holds it now (the holder may then drop its copy)."""
        status, _, body = await self._request("POST", url, "/v1/pull", where,
                                              json={"dataset": self.dataset, "from": holder, "keys": keys})
        self._check(status, body, where)
        return _json_field(body, "held", where)

    async def exists(self, url: str, where: str, keys: list[str]) -> list[bool]:
        """Whether the worker holds each of ``keys`` (``str(BlockKey)``)."""
        return await self._per_key(url, where, "/v1/exists", "cached", keys)

    async def verify(self, url: str, where: str, keys: list[str]) -> list[bool | None]:
        """Have the worker check each of ``keys`` it holds against its checksum, dropping those
        that fail (``datacache verify``): per key True (passed), False (dropped) or None (not held)."""
        return await self._per_key(url, where, "/v1/verify", "checked", keys)

    async def _per_key(self, url: str, where: str, path: str, field: str, keys: list[str]) -> list:
        """POST ``keys`` to ``path`` in batches of ``wire.MAX_KEYS``; the answers' ``field`` lists joined."""
        out: list = []
        for start in range(0, len(keys), wire.MAX_KEYS):
            chunk = keys[start:start + wire.MAX_KEYS]
            status, _, body = await self._request("POST", url, path, where, json={"dataset": self.dataset, "keys": chunk})
            self._check(status, body, where)
            out += _json_field(body, field, where)
        return out

    async def fill(self, url: str, where: str, entry: FileEntry, indexes: list[int],
                   check: bool = False, bulk: bool = False) -> tuple[int, int]:
        """Have the worker cache blocks ``indexes`` of ``entry`` (with ``check``, verifying the
        checksums of those it holds; with ``bulk``, writing around its page cache); returns
        ``(bytes it stored, of which read from the UFS)`` (the rest it copied from peers). Raises
        the UFS's error type (or ENOSPC) when the worker could not."""
        files = [{**wire.entry_fields(entry), "blocks": indexes}]
        request = {"dataset": self.dataset, "block_size": self.block_size, "files": files}
        if check:
            request["check"] = True
        if bulk:
            request["bulk"] = True
        status, _, body = await self._request("POST", url, "/v1/fill", where, json=request)
        self._check(status, body, where, entry.path)
        (result,) = _json_field(body, "results", where)
        if result.get("error"):
            wire.raise_error(result["error"], entry.path, where)
        return int(result.get("stored", 0)), int(result.get("ufs", 0))

    async def drain(self, url: str, where: str, seconds: int) -> dict:
        """Have the worker hand its blocks to their owners for at most ``seconds`` (it must be out
        of placement already, ``Membership.drain``); its report: ``{"blocks", "moved", "left",
        "stale", "seconds", "errors"}`` (see ``Peers.drain``)."""
        status, _, body = await self._request("POST", url, "/v1/drain", where,
                                              json={"dataset": self.dataset, "seconds": seconds})
        self._check(status, body, where)
        return _json_field(body, "drain", where)

    async def drop(self, url: str, where: str) -> int:
        """Delete every block of the dataset on the worker; returns how many."""
        status, _, body = await self._request("POST", url, "/v1/drop", where, json={"dataset": self.dataset})
        self._check(status, body, where)
        return int(_json_field(body, "dropped", where))

    async def metrics(self, url: str, where: str) -> dict[str, float]:
        """The worker's Prometheus samples (name -> value)."""
        status, _, body = await self._request("GET", url, "/metrics", where)
        self._check(status, body, where)
        return parse_metrics(body.decode())

    async def close(self) -> None:
        self._blocks.close()
        if self._session is not None:
            await self._session.close()


def _json_field(body: bytes, name: str, where: str):
    try:
        return json.loads(body)[name]
    except (ValueError, KeyError, TypeError):
        raise WorkerUnavailable(f"cache worker {where}: malformed answer") from None
