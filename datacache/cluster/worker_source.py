"""ClusterBlockSource: the block-source contract over a set of cache workers.

It keeps the contract :class:`~datacache.cache.blocksource.BlockSource` states, as
:class:`~datacache.cache.local_source.LocalBlockSource` does, so the Reader, DatasetClient, FUSE and
warmup do not know whether blocks are local or remote.

Read path, per block (see :mod:`.routing` for the order and the short-circuit rule):
1. the owner on this node with a readable cache directory: its block file, checksum verified;
2. else the owner over HTTP; on a connect error, timeout, disconnect, 5xx or bad checksum the
   worker is suspected and the next-ranked worker is asked (``tries`` workers at most);
3. then the UFS directly, through a LocalBlockSource whose store keeps nothing (same exact-version
   reads, single-flight and memory budget). A dead worker makes a read slower, never failed,
   while the UFS is up. UFS errors (ENOENT, ESTALE) reported by a worker are raised unchanged.

Warmup (``fill``) sends each block to its owner(s), one request per owner, in parallel; blocks of
a worker that fails are re-placed over the remaining workers, and if none is left the fill raises
``OSError(EHOSTDOWN)`` naming the file and why each worker failed (``cache worker worker-1 timed
out after 10s``), so warmup reports exactly what is missing and why. ``worker_progress()`` gives
bytes and blocks stored per worker, ``worker_failures()`` the last error of each worker that failed.

``is_cached`` asks, for every block of the file, the workers that may hold it (its owner and the
next candidates, :func:`placement.lookup`), one batched query per worker, and keeps the answer for
``exists_ttl`` seconds: a block counts as cached wherever it really is among the places a read
finds it (an owner that misses copies it from there, see :mod:`.peers`; workers being drained
are asked too), so status and reads agree.
Read-ahead fetches the next blocks in the background into the buffer of the source's
:class:`~datacache.cache.readahead.ReadAhead` (the client has no store of its own), held against
the memory budget until read or dropped; the direct UFS reads share that component.
"""

from __future__ import annotations

import errno
import functools
import threading
import time
from collections import Counter, OrderedDict

from datacache.cache.blocks import BlockKey, PieceBlock, block_count, block_range, file_id
from datacache.cache.budget import MemoryBudget
from datacache.cache.readahead import ReadAhead
from datacache.cache.memory import MemoryTier
from datacache.cache.local_source import LocalBlockSource
from datacache.cache.stats import HitStats
from datacache.cache.tiered import TieredStore
from datacache.cluster import auth
from datacache.cluster.worker_client import BlockVanished, LoopThread, WorkerClient, WorkerRejected, WorkerUnavailable
from datacache.cluster.member import Member
from datacache.cluster.membership import open_membership
from datacache.cluster.routing import Router
from datacache.errors import UFSUnavailableError
from datacache.manifest import FileEntry

_EXISTS_MAX = 4096  # files whose existence answers are kept
FETCH_THREADS = 4  # blocks fetched ahead from the workers at once


class ClusterBlockSource:
    """Blocks of ``dataset`` held by the workers that ``router`` finds.

    ``client``: a :class:`WorkerClient`; ``ufs``: the dataset's ``UnionNamespace`` (direct reads);
    ``readahead``: the read-ahead component (memory budget, fetches ahead), which this source
    closes; ``stats``: reader hit counters (or None); ``replicas``: workers
    holding each block; ``tries``: workers asked for one block before the UFS.
    """

    def __init__(self, dataset: str, router: Router, client: WorkerClient, ufs, readahead: ReadAhead,
                 stats: HitStats | None = None, replicas: int = 1, tries: int = 2, exists_ttl: float = 1.0):
        self.dataset = dataset
        self.block_size = client.block_size
        self.router = router
        self.readahead = readahead
        self.stats = stats
        self.replicas = replicas
        self.tries = max(tries, replicas)
        self.exists_ttl = exists_ttl
        self._client = client
        self._io = LoopThread()
        self._direct = LocalBlockSource(dataset, TieredStore([MemoryTier(0)]), ufs, self.block_size, readahead)
        self._remote_ufs_bytes = 0
        self._progress: Counter = Counter()
        self._failures: dict[str, str] = {}  # worker id -> last error of this client's fills
        self._exists: OrderedDict[str, tuple[float, list[bool]]] = OrderedDict()
        self._lock = threading.Lock()

    # -- the block-source interface ---------------------------------------------------------------
    def key(self, entry: FileEntry, index: int) -> BlockKey:
        return BlockKey(self.dataset, self._file_id(entry), index)

    @property
    def ufs_bytes(self) -> int:
        """Bytes read from the UFS for this client: by workers on its behalf and directly."""
        return self._remote_ufs_bytes + self._direct.ufs_bytes

    def get(self, entry: FileEntry, index: int, pieces: bool = False) -> bytes | memoryview | PieceBlock:
        """Block ``index`` of ``entry`` (bytes-like, short only for the last block; with
        ``pieces``, one read from a same-node disk tier may be a :class:`PieceBlock`). Raises
        FileNotFoundError / StaleFileError / UFSUnavailableError as the UFS does, never a
        worker's failure."""
        key = str(self.key(entry, index))
        data, hit, remote = self.readahead.take(key) or self._fetch(entry, index, key, pieces)
        if self.stats is not None:
            self.stats.count(self.dataset, hit, remote)
        return data

    def prefetch(self, entry: FileEntry, index: int) -> None:
        """Start fetching a block into the read-ahead buffer if the memory budget allows."""
        if index >= block_count(entry.size, self.block_size):
            return
        key = str(self.key(entry, index))
        start, end = block_range(index, entry.size, self.block_size)
        self.readahead.keep(key, end - start, functools.partial(self._fetch, entry, index, key))

    def fill(self, entry: FileEntry, first: int, last: int, check: bool = False, bulk: bool = False) -> int:
        """Warmup: have the owners cache blocks ``first..last``; returns the bytes newly stored.
        With ``check`` the workers verify the checksums of the blocks they hold, with ``bulk``
        they write around their page cache (see :meth:`LocalBlockSource.fill`). Raises the UFS's
        error, ``OSError(ENOSPC)`` from a full worker, or ``OSError(EHOSTDOWN)`` when no live
        worker is left to hold a block."""
        done, unplaced = self._scatter(entry, range(first, last + 1),
                                       lambda m, idx: self._client.fill(m.url, m.worker_id, entry, idx, check, bulk))
        self._forget(entry)
        stored, errors = 0, []
        for member, idx, result in done:
            if isinstance(result, BaseException):
                errors.append(result)
                continue
            stored += result[0]
            with self._lock:
                self._progress[(member.worker_id, "bytes")] += result[0]
                self._progress[(member.worker_id, "blocks")] += len(idx)
                self._remote_ufs_bytes += result[1]
        if errors:
            raise errors[0]
        if unplaced:
            with self._lock:
                why = "; ".join(self._failures.values()) or "see 'datacache get runtimes'"
            raise OSError(errno.EHOSTDOWN, f"no live cache worker could take blocks {unplaced[:8]}: {why}",
                          entry.path)
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

    def verify(self, entry: FileEntry) -> list[tuple[int, bool]]:
        """The scrub of ``entry``'s version (``datacache verify``): every live worker (drained
        ones too) checks the copies of its blocks it holds, dropping those that fail (see
        :meth:`LocalBlockSource.verify`); returns ``(index, passed)`` per copy checked. Raises
        ``WorkerUnavailable`` naming the workers that could not check theirs (the others did)."""
        keys = [str(self.key(entry, i)) for i in range(block_count(entry.size, self.block_size))]
        members = {m.worker_id: m for m in self.router.members() + self.router.draining()}.values()
        answers = self._io.gather([self._client.verify(m.url, m.worker_id, keys) for m in members])
        self._forget(entry)  # what is cached has changed
        failed = [f"{m.worker_id}: {a}" for m, a in zip(members, answers) if isinstance(a, BaseException)]
        if failed:
            raise WorkerUnavailable(f"{entry.path}: not checked on cache worker(s) {'; '.join(failed)}")
        return [(i, ok) for answer in answers for i, ok in enumerate(answer) if ok is not None]

    def usage(self) -> tuple[int, int]:
        """``(used, capacity)`` bytes summed over the live workers' first disk levels."""
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
        self._direct.close()  # and the read-ahead they share
        self._io.run(self._client.close())
        self._io.close()
        self.router.close()
        if self.stats is not None:
            self.stats.close()

    # -- cluster extras ------------------------------------------------------------------------------
    def worker_metrics(self) -> dict[str, dict[str, float]]:
        """Prometheus samples of every live worker that answered, by worker id."""
        members = self.router.members()
        answers = self._io.gather([self._client.metrics(m.url, m.worker_id) for m in members])
        return {m.worker_id: a for m, a in zip(members, answers) if isinstance(a, dict)}

    def worker_progress(self) -> dict[str, dict[str, int]]:
        """Per worker id: ``{"blocks", "bytes"}`` stored by this client's fills so far."""
        with self._lock:
            ids = sorted({w for w, _ in self._progress})
            return {w: {"blocks": self._progress[(w, "blocks")], "bytes": self._progress[(w, "bytes")]} for w in ids}

    def worker_failures(self) -> dict[str, str]:
        """Per worker id whose share of this client's fills went elsewhere: its last failure
        (``cache worker worker-1 timed out after 10s``)."""
        with self._lock:
            return dict(self._failures)

    def drop(self) -> int:
        """Delete the dataset's blocks on every live worker; returns how many went."""
        members = self.router.members()
        answers = self._io.gather([self._client.drop(m.url, m.worker_id) for m in members])
        return sum(a for a in answers if isinstance(a, int))

    # -- internals -------------------------------------------------------------------------------
    def _file_id(self, entry: FileEntry) -> str:
        return file_id(entry.mount, entry.ufs_path, entry.version, self.block_size)

    def _fetch(self, entry: FileEntry, index: int, key: str, pieces: bool = False) -> tuple[bytes, bool, bool]:
        """The read path of the module docstring; ``(bytes, hit, remote)``, ``remote``: served by a
        worker on another node (``remoteHitRatio``; short-circuit and same-node hits are local).
        ``pieces``: a short-circuit read may return a :class:`PieceBlock`."""
        for member in self.router.candidates(key)[:self.tries]:
            tier = self.router.local_tier(member)
            data = None
            if tier is not None:
                data = tier.get_pieces(key) if pieces else tier.get(key)
            if data is not None:
                return data, True, False
            try:
                data, hit = self._get_from(member, entry, index)
            except WorkerUnavailable:
                self.router.suspect(member)
                continue
            except (WorkerRejected, UFSUnavailableError):
                break  # this worker cannot serve it (or cannot reach the UFS): read it from here
            self.router.trust(member)
            if not hit:
                self._forget(entry)
                with self._lock:
                    self._remote_ufs_bytes += len(data)
            return data, hit, member.node != self.router.node
        return self._direct.get(entry, index), False, False

    def _get_from(self, member: Member, entry: FileEntry, index: int) -> tuple[bytes, bool]:
        local = member.node == self.router.node
        try:
            return self._client.get_block(member.url, member.worker_id, entry, index, local=local)
        except BlockVanished:
            try:
                return self._client.get_block(member.url, member.worker_id, entry, index, verify=True, local=local)
            except BlockVanished:
                raise WorkerUnavailable(f"cache worker {member.worker_id} sent a corrupt block twice") from None

    def _scatter(self, entry: FileEntry, indexes, call):
        """Run ``call(member, [index, ...])`` once per owner of the blocks ``indexes``, in parallel;
        an owner that is unavailable is suspected and its blocks go to the next owners, until none
        is left. Returns ``([(member, indexes, result or exception)], [indexes no worker took])``."""
        pending, done = set(indexes), []
        while pending:
            plan: dict[str, tuple[Member, list[int]]] = {}
            for i in sorted(pending):
                for member in self.router.candidates(str(self.key(entry, i)))[:self.replicas]:
                    plan.setdefault(member.worker_id, (member, []))[1].append(i)
            if not plan:
                break
            results = self._io.gather([call(m, idx) for m, idx in plan.values()])
            pending = set()
            for (member, idx), result in zip(plan.values(), results):
                if isinstance(result, WorkerUnavailable):
                    self.router.suspect(member)
                    with self._lock:
                        self._failures[member.worker_id] = str(result)
                    pending.update(idx)
                else:
                    done.append((member, idx, result))
        return done, sorted(pending)

    def _query_file(self, entry: FileEntry) -> list[bool]:
        """Per block of ``entry``: held by one of the workers a read would find it on."""
        keys = [str(self.key(entry, i)) for i in range(block_count(entry.size, self.block_size))]
        asks: dict[str, tuple[Member, list[int]]] = {}
        draining = self.router.draining()  # their blocks are found too, by the owners' read-repair
        for i, key in enumerate(keys):
            for member in self.router.lookup(key, self.replicas) + draining:
                asks.setdefault(member.worker_id, (member, []))[1].append(i)
        answers = self._io.gather([self._client.exists(m.url, m.worker_id, [keys[i] for i in idx])
                                   for m, idx in asks.values()])
        cached = [False] * len(keys)
        for (member, idx), answer in zip(asks.values(), answers):
            if isinstance(answer, WorkerUnavailable):  # counts as not holding them
                self.router.suspect(member)
                continue
            if isinstance(answer, BaseException):
                raise answer
            for i, held in zip(idx, answer):
                cached[i] = cached[i] or held
        return cached

    def _forget(self, entry: FileEntry) -> None:
        with self._lock:
            self._exists.pop(self._file_id(entry), None)



def connect(home: str, runtime, ufs, budget: MemoryBudget, stats: HitStats | None = None, *,
            short_circuit: bool = True, connect_timeout: float = 1.0, read_timeout: float = 10.0,
            replicas: int = 1) -> ClusterBlockSource:
    """A ClusterBlockSource for CacheRuntime ``runtime`` (a model) of the embedded plane at ``home``
    (timeouts in seconds). Raises ``ResourceError`` when the runtime has no worker token yet."""
    ns, name = runtime.metadata.namespace, runtime.metadata.name
    client = WorkerClient(auth.load_token(home, ns, name), name, runtime.spec.block_size_bytes,
                          connect_timeout, read_timeout)
    router = Router(open_membership(home), ns, name, short_circuit=short_circuit)
    readahead = ReadAhead(budget, runtime.spec.block_size_bytes, fill_threads=FETCH_THREADS)
    return ClusterBlockSource(name, router, client, ufs, readahead, stats, replicas=replicas)
