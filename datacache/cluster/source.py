"""ClusterBlockSource: the block-source interface over a set of cache workers.

It has exactly the interface of :class:`~datacache.cache.source.LocalBlockSource` (``block_size``,
``get``, ``prefetch``, ``fill``, ``is_cached``, ``usage``, ``hit_counts``, ``ufs_bytes``, ``close``),
so the Reader, DatasetClient, FUSE and warmup do not know whether blocks are local or remote.

Read path, per block (see :mod:`.routing` for the order and the short-circuit rule):
1. the owner on this node with a readable cache directory: its block file, checksum verified;
2. else the owner over HTTP; on a connect error, timeout, disconnect, 5xx or bad checksum the
   worker is suspected and the next-ranked worker is asked (``tries`` workers at most);
3. then the UFS directly, through a LocalBlockSource whose store keeps nothing (same exact-version
   reads, single-flight and memory budget). A dead worker makes a read slower, never failed,
   while the UFS is up. UFS errors (ENOENT, ESTALE) reported by a worker are raised unchanged.

Warmup (``fill``) sends each block to its owner(s), one request per owner, in parallel; blocks of
a worker that fails are re-placed over the remaining workers, and if none is left the fill raises
``OSError(EHOSTDOWN)`` naming the file, so warmup reports exactly what is missing.
``worker_progress()`` gives bytes and blocks stored per worker. ``is_cached`` asks the owners of all
blocks of the file in one batched query per owner and keeps the answer for ``exists_ttl`` seconds.
Read-ahead fetches blocks into a small buffer held against the shared memory budget.
"""

from __future__ import annotations

import asyncio
import errno
import threading
import time
from collections import Counter, OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

from datacache.cache.blocks import BlockKey, block_count, block_range, file_id
from datacache.cache.budget import MemoryBudget
from datacache.cache.memory import MemoryTier
from datacache.cache.source import LocalBlockSource
from datacache.cache.stats import HitStats
from datacache.cache.tiered import TieredStore
from datacache.cluster.client import BlockVanished, LoopThread, WorkerClient, WorkerRejected, WorkerUnavailable
from datacache.cluster.membership import Member
from datacache.cluster.routing import Router
from datacache.errors import UFSUnavailableError
from datacache.manifest import FileEntry

_EXISTS_MAX = 4096  # files whose existence answers are kept


class ClusterBlockSource:
    """Blocks of ``dataset`` held by the workers that ``router`` finds.

    ``client``: a :class:`WorkerClient`; ``ufs``: the dataset's ``UnionNamespace`` (direct reads);
    ``budget``: shared memory budget; ``stats``: reader hit counters (or None); ``replicas``: workers
    holding each block; ``tries``: workers asked for one block before the UFS.
    """

    def __init__(self, dataset: str, router: Router, client: WorkerClient, ufs, budget: MemoryBudget,
                 stats: HitStats | None = None, replicas: int = 1, tries: int = 2, exists_ttl: float = 1.0):
        self.dataset = dataset
        self.block_size = client.block_size
        self.router = router
        self.budget = budget
        self.stats = stats
        self.replicas = replicas
        self.tries = max(tries, replicas)
        self.exists_ttl = exists_ttl
        self._client = client
        self._io = LoopThread()
        self._direct = LocalBlockSource(dataset, TieredStore([MemoryTier(0)]), ufs, self.block_size, budget)
        self._remote_ufs_bytes = 0
        self._progress: Counter = Counter()
        self._ahead: OrderedDict[str, tuple[Future, int]] = OrderedDict()
        self._ahead_max = max(1, min(16, budget.limit // (2 * self.block_size)))
        self._ahead_pool = ThreadPoolExecutor(4, thread_name_prefix="datacache-readahead")
        self._exists: OrderedDict[str, tuple[float, list[bool]]] = OrderedDict()
        self._lock = threading.Lock()

    # -- the block-source interface ---------------------------------------------------------------
    def key(self, entry: FileEntry, index: int) -> BlockKey:
        return BlockKey(self.dataset, self._file_id(entry), index)

    @property
    def ufs_bytes(self) -> int:
        """Bytes read from the UFS for this client: by workers on its behalf and directly."""
        return self._remote_ufs_bytes + self._direct.ufs_bytes

    def get(self, entry: FileEntry, index: int) -> bytes:
        """Block ``index`` of ``entry``. Raises FileNotFoundError / StaleFileError /
        UFSUnavailableError as the UFS does; never a worker's failure."""
        key = str(self.key(entry, index))
        data = self._take_ahead(key)
        hit = data is not None
        if data is None:
            data, hit = self._fetch(entry, index, key)
        if self.stats is not None:
            self.stats.count(self.dataset, hit)
        return data

    def prefetch(self, entry: FileEntry, index: int) -> None:
        """Start fetching a block into the read-ahead buffer if the memory budget allows."""
        if index >= block_count(entry.size, self.block_size):
            return
        key = str(self.key(entry, index))
        start, end = block_range(index, entry.size, self.block_size)
        with self._lock:
            if key in self._ahead or not self.budget.acquire(end - start, blocking=False):
                return
            if len(self._ahead) >= self._ahead_max:
                self._release(*self._ahead.popitem(last=False)[1])
            self._ahead[key] = (self._ahead_pool.submit(self._fetch, entry, index, key), end - start)

    def fill(self, entry: FileEntry, first: int, last: int) -> int:
        """Warmup: have the owners cache blocks ``first..last``; returns the bytes newly stored.
        Raises the UFS's error, ``OSError(ENOSPC)`` from a full worker, or ``OSError(EHOSTDOWN)``
        when no live worker is left to hold a block."""
        pending = set(range(first, last + 1))
        stored, errors = 0, []
        while pending:
            plan: dict[str, tuple[Member, list[int]]] = {}
            for i in sorted(pending):
                for member in self.router.candidates(str(self.key(entry, i)))[:self.replicas]:
                    plan.setdefault(member.worker_id, (member, []))[1].append(i)
            if not plan:
                raise OSError(errno.EHOSTDOWN, f"no live cache worker to hold blocks {sorted(pending)[:8]} "
                                               f"(see 'datacache get runtimes')", entry.path)
            jobs = [self._client.fill(m.url, m.worker_id, entry, idx) for m, idx in plan.values()]
            results = self._io.run(asyncio.gather(*jobs, return_exceptions=True))
            pending = set()
            for (member, idx), result in zip(plan.values(), results):
                if isinstance(result, WorkerUnavailable):
                    self.router.suspect(member)
                    pending.update(idx)
                elif isinstance(result, BaseException):
                    errors.append(result)
                else:
                    stored += result
                    with self._lock:
                        self._progress[(member.worker_id, "bytes")] += result
                        self._progress[(member.worker_id, "blocks")] += len(idx)
        self._forget(entry)
        with self._lock:
            self._remote_ufs_bytes += stored
        if errors:
            raise errors[0]
        return stored

    def is_cached(self, entry: FileEntry, index: int) -> bool:
        """Whether the block's owner holds it (an unreachable owner counts as not holding it)."""
        fid, now = self._file_id(entry), time.monotonic()
        with self._lock:
            known = self._exists.get(fid)
        if known is None or known[0] < now:
            known = (now + self.exists_ttl, self._query_file(entry))
            with self._lock:
                self._exists[fid] = known
                while len(self._exists) > _EXISTS_MAX:
                    self._exists.popitem(last=False)
        return known[1][index]

    def usage(self) -> tuple[int, int]:
        """``(used, capacity)`` bytes summed over the live workers' largest levels."""
        used = capacity = 0
        for sample in self.worker_metrics().values():
            used += int(sample.get("datacache_worker_used_bytes", 0))
            capacity += int(sample.get("datacache_worker_total_capacity_bytes", 0))
        return used, capacity

    def hit_counts(self) -> tuple[int, int]:
        """``(hits, misses)`` of reader block requests, over every process using this runtime."""
        return self.stats.get(self.dataset) if self.stats is not None else (0, 0)

    def close(self) -> None:
        """Stop read-ahead, close connections and the short-circuit readers."""
        self._ahead_pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            for fut, n in self._ahead.values():
                self._release(fut, n)
            self._ahead.clear()
        self._direct.close()
        self._io.run(self._client.close())
        self._io.close()
        self.router.close()
        if self.stats is not None:
            self.stats.close()

    # -- cluster extras ------------------------------------------------------------------------------
    def worker_metrics(self) -> dict[str, dict[str, float]]:
        """Prometheus samples of every live worker that answered, by worker id."""
        members = self.router.members()
        answers = self._io.run(asyncio.gather(*(self._client.metrics(m.url, m.worker_id) for m in members),
                                              return_exceptions=True))
        return {m.worker_id: a for m, a in zip(members, answers) if isinstance(a, dict)}

    def worker_progress(self) -> dict[str, dict[str, int]]:
        """Per worker id: ``{"blocks", "bytes"}`` stored by this client's fills so far."""
        with self._lock:
            ids = sorted({w for w, _ in self._progress})
            return {w: {"blocks": self._progress[(w, "blocks")], "bytes": self._progress[(w, "bytes")]} for w in ids}

    def drop(self) -> int:
        """Delete the dataset's blocks on every live worker; returns how many went."""
        members = self.router.members()
        answers = self._io.run(asyncio.gather(*(self._client.drop(m.url, m.worker_id) for m in members),
                                              return_exceptions=True))
        return sum(a for a in answers if isinstance(a, int))

    # -- internals -------------------------------------------------------------------------------
    def _file_id(self, entry: FileEntry) -> str:
        return file_id(entry.mount, entry.ufs_path, entry.version, self.block_size)

    def _fetch(self, entry: FileEntry, index: int, key: str) -> tuple[bytes, bool]:
        """The read path of the module docstring; ``(bytes, hit)``."""
        for member in self.router.candidates(key)[:self.tries]:
            tier = self.router.local_tier(member)
            data = tier.get(key) if tier is not None else None
            if data is not None:
                return data, True
            try:
                data, hit = self._get_from(member, entry, index)
            except WorkerUnavailable:
                self.router.suspect(member)
                continue
            except (WorkerRejected, UFSUnavailableError):
                break  # this worker cannot serve it (or cannot reach the UFS): read it from here
            if not hit:
                self._forget(entry)
                with self._lock:
                    self._remote_ufs_bytes += len(data)
            return data, hit
        return self._direct.get(entry, index), False

    def _get_from(self, member: Member, entry: FileEntry, index: int) -> tuple[bytes, bool]:
        try:
            return self._io.run(self._client.get_block(member.url, member.worker_id, entry, index))
        except BlockVanished:
            try:
                return self._io.run(self._client.get_block(member.url, member.worker_id, entry, index, verify=True))
            except BlockVanished:
                raise WorkerUnavailable(f"cache worker {member.worker_id} sent a corrupt block twice") from None

    def _query_file(self, entry: FileEntry) -> list[bool]:
        keys = [str(self.key(entry, i)) for i in range(block_count(entry.size, self.block_size))]
        asks: dict[str, tuple[Member, list[int]]] = {}
        for i, key in enumerate(keys):
            for member in self.router.candidates(key)[:self.replicas]:
                asks.setdefault(member.worker_id, (member, []))[1].append(i)
        jobs = [self._client.exists(m.url, m.worker_id, [keys[i] for i in idx]) for m, idx in asks.values()]
        answers = self._io.run(asyncio.gather(*jobs, return_exceptions=True)) if jobs else []
        cached = [False] * len(keys)
        for (member, idx), answer in zip(asks.values(), answers):
            if isinstance(answer, WorkerUnavailable):
                self.router.suspect(member)
            elif isinstance(answer, BaseException):
                raise answer
            else:
                for i, held in zip(idx, answer):
                    cached[i] = cached[i] or held
        return cached

    def _forget(self, entry: FileEntry) -> None:
        with self._lock:
            self._exists.pop(self._file_id(entry), None)

    def _take_ahead(self, key: str) -> bytes | None:
        with self._lock:
            found = self._ahead.pop(key, None)
        if found is None:
            return None
        fut, n = found
        try:
            return fut.result()[0]
        except Exception:  # the demand read retries and raises what it finds
            return None
        finally:
            self._release(fut, n)

    def _release(self, fut: Future, nbytes: int) -> None:
        fut.add_done_callback(lambda _: self.budget.release(nbytes))
