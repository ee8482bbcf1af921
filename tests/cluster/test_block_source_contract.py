"""The block-source contract (datacache.cache.blocksource.BlockSource), one suite for every
implementation: the in-process LocalBlockSource and the ClusterBlockSource over two worker
processes, both reading a real S3 server (moto) through a proxy that counts the object GETs.

Cases: a miss then hits, single-flight (concurrent readers of one cold block make one UFS GET),
warmup fills, the memory budget (read-ahead skipped without room, back to 0 after), read-ahead
through the source's ReadAhead (a prefetched block is read without a second UFS or worker GET;
read-ahead nobody reads stays within the budget and gives it back; many sequential readers on
one thread per pool never deadlock), a version change (an uncached block of the old version is
ESTALE, never new bytes; cached ones stay), a corrupt block on disk (never returned, and dropped
by the scrub), and, for workers, a dead worker (a slower read only).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import threading
import time
import uuid

import pytest

from cluster_support import corrupt_block_files, kill_worker, reap, wait_for, worker_dirs, worker_metrics
from datacache.cache import readahead
from datacache.cache.blocks import block_count, block_range
from datacache.cache.blocksource import BlockSource
from datacache.cluster import worker_source
from datacache.errors import StaleFileError
from support import apply_dataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "faults"))
from faultproxy import FaultProxy  # noqa: E402

BS = 256 << 10
KINDS = {"in-process": 1, "workers": 2}  # kind -> CacheRuntime replicas


@pytest.fixture(scope="module", params=list(KINDS))
def stack(request, moto_server, tmp_path_factory):
    """``(kind, plane, proxy, bucket fs, bucket, home)``: a dataset over an S3 bucket reached
    through a counting proxy, with the runtime's blocks in-process or on two workers."""
    kind = request.param
    home = tmp_path_factory.mktemp(kind) / "home"
    home.mkdir()
    for key in ("key", "secret"):  # worker processes read secrets from files
        (home / "secrets" / "moto").mkdir(parents=True, exist_ok=True)
        (home / "secrets" / "moto" / key).write_text("testing")
    fs = moto_server.s3fs()
    bucket = f"contract-{uuid.uuid4().hex[:12]}"
    fs.mkdir(bucket)
    for name in ("seed.bin",):  # the first sync needs a file
        fs.pipe(f"{bucket}/{name}", os.urandom(1000))
    with FaultProxy(moto_server.endpoint_url) as proxy:
        mount = {"name": "s3", "mountPoint": f"s3://{bucket}", "options": {"endpoint_url": proxy.endpoint_url},
                 "encryptOptions": [{"name": k, "valueFrom": {"secretKeyRef": {"name": "moto", "key": k}}}
                                    for k in ("key", "secret")]}
        levels = [{"mediumtype": "SSD", "path": "cache", "quota": "256Mi"}]
        plane = apply_dataset(home, "contract", [mount], levels, block_size="256Ki")
        if KINDS[kind] > 1:
            runtime = plane.get("CacheRuntime", "contract")
            runtime.spec.replicas = KINDS[kind]
            plane.apply([runtime])
        try:
            yield kind, plane, proxy, fs, bucket, home
        finally:
            plane.close()
            leftovers = reap(home)
            assert not leftovers, f"processes left running: {leftovers}"


def _new_file(stack, size: int) -> tuple[str, bytes]:
    """Put a fresh object of ``size`` random bytes and sync; returns ``(name, bytes)``."""
    _, plane, _, fs, bucket, _ = stack
    name = f"f-{uuid.uuid4().hex[:10]}.bin"
    data = os.urandom(size)
    fs.pipe(f"{bucket}/{name}", data)
    plane.sync("contract")
    return name, data


def _open(stack):
    client = stack[1].open_dataset("contract")
    assert isinstance(client.source, BlockSource)
    return client


@contextlib.contextmanager
def _reading(stack, size: int):
    """A fresh object of ``size`` bytes and a client: ``(name, bytes, entry, source)``."""
    name, data = _new_file(stack, size)
    client = _open(stack)
    try:
        yield name, data, client.stat(name), client.source
    finally:
        client.close()


def _block(data: bytes, index: int) -> bytes:
    a, b = block_range(index, len(data), BS)
    return data[a:b]


def test_a_miss_is_filled_once_then_hits(stack):
    proxy = stack[2]
    with _reading(stack, 3 * BS + 100) as (name, data, entry, source):
        assert source.block_size == BS and not source.is_cached(entry, 1)
        hits0, misses0 = source.hit_counts()
        assert bytes(source.get(entry, 1)) == _block(data, 1)
        gets = proxy.object_gets(name)
        assert gets == 1 and source.is_cached(entry, 1)
        for _ in range(3):
            assert bytes(source.get(entry, 1)) == _block(data, 1)
        assert bytes(source.get(entry, 3)) == _block(data, 3)  # the short last block
        assert proxy.object_gets(name) == gets + 1  # block 3 only: the hits read nothing
        hits, misses = source.hit_counts()
        assert (hits - hits0, misses - misses0) == (3, 2)


def test_concurrent_readers_of_a_cold_block_make_one_ufs_read(stack):
    with _reading(stack, 2 * BS) as (name, data, entry, source):
        got, errors, start = [], [], threading.Barrier(8)

        def read():
            try:
                start.wait()
                got.append(hashlib.sha256(bytes(source.get(entry, 0))).hexdigest())
            except Exception as err:  # reported below
                errors.append(err)

        threads = [threading.Thread(target=read) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors and got == [hashlib.sha256(_block(data, 0)).hexdigest()] * 8
        assert stack[2].object_gets(name) == 1
        assert source.readahead.budget.used == 0


def test_fill_stores_each_missing_block_once(stack):
    with _reading(stack, 5 * BS + 7) as (name, data, entry, source):
        n = block_count(entry.size, BS)
        assert bytes(source.get(entry, 2)) == _block(data, 2)
        assert source.fill(entry, 0, n - 1) == len(data) - len(_block(data, 2))
        assert source.fill(entry, 0, n - 1) == 0
        assert all(source.is_cached(entry, i) for i in range(n))
        gets = stack[2].object_gets(name)
        assert b"".join(bytes(source.get(entry, i)) for i in range(n)) == data
        assert stack[2].object_gets(name) == gets
        assert source.readahead.budget.used == 0


def test_read_ahead_stays_within_the_budget(stack):
    with _reading(stack, 3 * BS) as (name, data, entry, source):
        budget = source.readahead.budget
        assert budget.acquire(budget.limit, blocking=False)  # no room at all
        try:
            source.prefetch(entry, 0)
            time.sleep(0.5)
            assert stack[2].object_gets(name) == 0 and not source.is_cached(entry, 0)
        finally:
            budget.release(budget.limit)
        source.prefetch(entry, 1)
        source.prefetch(entry, block_count(entry.size, BS))  # past the end: nothing
        deadline = time.monotonic() + 30
        while not source.is_cached(entry, 1) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert source.is_cached(entry, 1)
        assert bytes(source.get(entry, 1)) == _block(data, 1)
        assert stack[2].object_gets(name) == 1
        assert budget.used == 0 and budget.peak <= budget.limit


def _served(stack) -> int:
    """Block GETs the runtime's workers answered so far (0 in-process: no workers)."""
    kind, home = stack[0], stack[5]
    if KINDS[kind] == 1:
        return 0
    return int(sum(m.get("datacache_worker_hits_total", 0) + m.get("datacache_worker_misses_total", 0)
                   for m in worker_metrics(home, "contract").values()))


def test_a_prefetched_block_is_read_without_a_second_fetch(stack):
    workers = KINDS[stack[0]] > 1
    with _reading(stack, 3 * BS) as (name, data, entry, source):
        if workers:  # every read from a worker is then a GET it counts (no same-node block file read)
            source.router.short_circuit = False
        served = _served(stack)
        source.prefetch(entry, 1)
        wait_for(lambda: stack[2].object_gets(name) == 1 and source.is_cached(entry, 1), 30, "block 1 prefetched")
        assert bytes(source.get(entry, 1)) == _block(data, 1)
        assert stack[2].object_gets(name) == 1  # the one UFS GET of the prefetch
        assert _served(stack) - served == (1 if workers else 0)  # the prefetch's GET only
        wait_for(lambda: source.readahead.budget.used == 0, 30, "the prefetch's memory to be given back")


def test_read_ahead_nobody_reads_stays_within_the_budget_and_is_given_back(stack):
    name, data = _new_file(stack, 8 * BS)
    client = _open(stack)
    budget = client.source.readahead.budget
    limit, budget.limit = budget.limit, 4 * BS  # blocks kept ahead: 2 at most (half the budget)
    budget.peak = budget.used
    try:
        entry = client.stat(name)
        with client.open(name) as f:  # a run of two blocks, then left: 2 and 3 were loading ahead
            assert f.read(2 * BS) == data[:2 * BS]
        for i in range(8):  # hints beyond what the buffer keeps: the oldest go first
            client.source.prefetch(entry, i)
        wait_for(lambda: budget.used <= budget.limit // 2, 30, "read-ahead to settle within half the budget")
        assert budget.peak <= budget.limit
        assert stack[2].object_gets(name) <= 8  # never a block twice from the UFS
    finally:
        client.close()
        budget.limit = limit
    assert budget.used == 0


def test_many_sequential_readers_on_one_thread_per_pool_never_deadlock(stack, monkeypatch):
    """A load ahead (``source.get``) waits for the fill a hint started. With one pool for both,
    loads queued before the fills they wait for take every thread and hang for good; with one
    thread per pool, twelve readers of three cold files, staggered a block apart, all finish."""
    monkeypatch.setattr(readahead, "FILL_THREADS", 1)
    monkeypatch.setattr(readahead, "LOAD_THREADS", 1)
    monkeypatch.setattr(worker_source, "FETCH_THREADS", 1)
    files = dict(_new_file(stack, 10 * BS + 5) for _ in range(3))
    client = _open(stack)
    want = {(name, k): hashlib.sha256(data[k * BS:]).hexdigest() for name, data in files.items() for k in range(4)}
    got, errors = {}, []

    def read(name: str, first: int) -> None:
        try:
            h = hashlib.sha256()
            with client.open(name) as f:
                f.seek(first * BS)
                while chunk := f.read(64 << 10):
                    h.update(chunk)
            got[(name, first)] = h.hexdigest()
        except Exception as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=read, args=key, daemon=True) for key in want]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    hung = sum(t.is_alive() for t in threads)
    if hung:  # the client stays open: closing it would wait for the hung loads
        pytest.fail(f"{hung} of {len(threads)} sequential readers hung (loads ahead deadlocked)")
    assert not errors and got == want
    client.close()
    assert client.source.readahead.budget.used == 0


def test_a_changed_object_never_serves_new_bytes_for_the_old_version(stack):
    _, plane, _, fs, bucket, _ = stack
    name, old = _new_file(stack, 2 * BS)
    client = _open(stack)
    try:
        entry, source = client.stat(name), client.source
        assert bytes(source.get(entry, 0)) == _block(old, 0)
        new = os.urandom(3 * BS)
        fs.pipe(f"{bucket}/{name}", new)
        assert bytes(source.get(entry, 0)) == _block(old, 0)  # cached: the old version, whole
        with pytest.raises(StaleFileError):
            source.get(entry, 1)  # not cached: never the new object's bytes
        assert not source.is_cached(entry, 1)
        plane.sync("contract")
        client.namespace.reload()
        fresh = client.stat(name)
        assert fresh.version != entry.version and source.key(fresh, 0) != source.key(entry, 0)
        assert b"".join(bytes(source.get(fresh, i)) for i in range(3)) == new
    finally:
        client.close()


def _cache_dirs(stack) -> list[str]:
    kind, _, _, _, _, home = stack
    if KINDS[kind] > 1:
        return list(worker_dirs(home, "contract").values())
    return [os.path.join(str(home), "cache", "default", "contract")]


def test_a_corrupt_block_on_disk_is_never_returned(stack):
    with _reading(stack, 2 * BS) as (name, data, entry, source):
        source.fill(entry, 0, 1)
        assert corrupt_block_files(_cache_dirs(stack), str(source.key(entry, 0))) >= 1
    client = _open(stack)  # a new reader: nothing of the block in memory
    try:
        assert bytes(client.source.get(entry, 0)) == _block(data, 0)
    finally:
        client.close()


def test_verify_drops_only_the_corrupt_block_and_fetches_nothing(stack):
    with _reading(stack, 3 * BS) as (name, data, entry, source):
        source.fill(entry, 0, 2)
        assert corrupt_block_files(_cache_dirs(stack), str(source.key(entry, 0))) >= 1
        fetched = source.ufs_bytes
        assert sorted(source.verify(entry)) == [(0, False), (1, True), (2, True)]
        assert sorted(source.verify(entry)) == [(1, True), (2, True)]  # dropped: nothing left to check
        assert [source.is_cached(entry, i) for i in range(3)] == [False, True, True]
        assert source.ufs_bytes == fetched
        assert bytes(source.get(entry, 0)) == _block(data, 0)  # the next read refetches it


@pytest.mark.parametrize("stack", ["workers"], indirect=True)  # in-process: no worker to kill
def test_a_dead_worker_makes_a_read_slower_not_failed(stack):
    home = stack[5]
    with _reading(stack, 4 * BS) as (name, data, entry, source):
        source.fill(entry, 0, 3)
        owner = source.router.candidates(str(source.key(entry, 0)))[0]
        kill_worker(home, "contract", owner.worker_id)
        assert b"".join(bytes(source.get(entry, i)) for i in range(4)) == data
