"""Prefetch by the plan (issue 21 item 2): the UFS sees the plan's order, a bounded distance
ahead of the reader; a read out of order is served as any other."""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time

import pytest

from datacache.control.embedded import read_path
from datacache.control.supervisor import wait_until
from datacache.plan.follow import PlanFollower
from datacache.stack.plans import publish_plan, withdraw_plans
from plan_support import make_dataset

N = 80
AHEAD = 4


class RecordingUFS:
    """The dataset's UFS behind a recorder: every read's file, in the order the UFS got them,
    each ``delay`` seconds late (a remote store's latency)."""

    def __init__(self, inner, delay: float):
        self.inner, self.delay = inner, delay
        self.fetched: list[str] = []
        self._lock = threading.Lock()

    def read(self, mount, ufs_path, version, start, end):
        time.sleep(self.delay)
        with self._lock:
            self.fetched.append(os.path.basename(ufs_path))
        return self.inner.read(mount, ufs_path, version, start, end)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture
def pics(datacache_home, tmp_path):
    """``(plane, {path: bytes})``: dataset ``pics`` of N files of 1000-1079 bytes."""
    plane, files = make_dataset(datacache_home, tmp_path, "pics", [1000 + i for i in range(N)])
    yield plane, files
    plane.close()


@contextlib.contextmanager
def _following(plane, threads: int):
    """``(client, follower, recording)``: a DatasetClient of "pics" whose PlanFollower prefetches
    with ``threads`` threads at most ``AHEAD`` files ahead, its UFS recording what it fetched;
    closed at exit."""
    paths = read_path(plane.home)
    client = paths.open_dataset("pics")
    try:
        follower = next(r for r in client._readers if isinstance(r, PlanFollower))
        follower.ahead_bytes, follower.threads = AHEAD * 1079, threads
        follower.watcher.interval = 0
        recording = client.source.ufs = RecordingUFS(client.source.ufs, delay=0.005)
        yield client, follower, recording
    finally:
        client.close()
        paths.close()


def test_fetches_follow_the_plan_within_the_window(pics):
    plane, files = pics
    order = random.Random(5).sample(sorted(files), N)
    publish_plan(plane.paths, "pics", order)
    with _following(plane, threads=1) as (client, follower, recording):
        for i, path in enumerate(order):
            fetched = list(recording.fetched)
            # nothing further than AHEAD files past the last file read (position i - 1)
            assert all(order.index(f"train/{name}") <= i - 1 + AHEAD for name in fetched), (i, fetched)
            with client.open(path) as f:
                assert f.read() == files[path]
            time.sleep(0.03)
        assert [f"train/{name}" for name in recording.fetched] == order  # plan order, each file once
        (prefetcher,) = follower.prefetchers.values()
        assert 0 < prefetcher.peak_ahead <= AHEAD * 1079
        hits, misses = client.source.hit_counts()
        assert hits + misses == N and misses <= 2, (hits, misses)  # the first read may beat the prefetch


def test_a_read_out_of_order_is_served_and_moves_nothing(pics):
    plane, files = pics
    order = sorted(files)
    publish_plan(plane.paths, "pics", order)
    with _following(plane, threads=2) as (client, follower, recording):
        for path in order[:6]:
            assert client.read(client.stat(path), 0, 1 << 20) == files[path]
        stray = order[-1]  # 74 files ahead of the reader: out of order
        assert client.read(client.stat(stray), 0, 1 << 20) == files[stray]
        (cursor,) = follower.cursors
        assert cursor.position == 5
        time.sleep(0.3)
        assert {f"train/{n}" for n in recording.fetched} <= set(order[:6 + AHEAD]) | {stray}
        disk = client.source.store.levels[0]
        assert disk.rank_victims is not None  # the plan ranks the disk tier's evictions
        withdraw_plans(plane.home, "pics")
        client.read(client.stat(order[6]), 0, 10)
        assert follower.prefetchers == {} and disk.rank_victims is None  # no plan: LRU again


def test_a_plan_opens_the_ufs_ahead_of_its_fills(pics):
    """A reader of cached blocks opens no UFS mount (no client import, no credentials); once it
    follows a plan, its process will fill from the UFS, and the mounts open in the background."""
    plane, files = pics
    plane.warmup("pics", [])
    order = sorted(files)
    paths = read_path(plane.home)
    client = paths.open_dataset("pics")
    try:
        assert client.read(client.stat(order[0]), 0, 1 << 20) == files[order[0]]
        time.sleep(0.2)
        assert client.ufs._mounts is None  # no plan: nothing opened for a cached read
        publish_plan(plane.paths, "pics", order)
        time.sleep(0.1)  # the follower looks at the plan directory at most once per interval
        assert client.read(client.stat(order[1]), 0, 1 << 20) == files[order[1]]
        assert wait_until(lambda: client.ufs._mounts is not None, 10), "the plan did not open the UFS mounts"
        assert list(client.ufs.mounts) == ["local"]
        hits, misses = client.source.hit_counts()
        assert misses == 0  # both reads were hits: the mounts were opened for the plan, not by a read
    finally:
        client.close()
        paths.close()


def test_a_changed_file_is_prefetched_at_its_new_version(pics, tmp_path):
    plane, files = pics
    order = sorted(files)[:10]
    changed = order[3]
    new = os.urandom(2000)
    (tmp_path / "src-pics" / changed).write_bytes(new)
    plane.sync("pics")
    publish_plan(plane.paths, "pics", order)
    with _following(plane, threads=2) as (client, follower, recording):
        with client.open(order[0]) as f:
            f.read()
        deadline = time.monotonic() + 10
        while "003.jpg" not in recording.fetched and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.1)  # the fill stores the block after the UFS read
        assert client.read(client.stat(changed), 0, 1 << 20) == new
        assert recording.fetched.count("003.jpg") == 1  # the new version was there: a hit
        assert client.cached_fraction(client.stat(changed)) == 1.0


def test_one_process_per_node_prefetches_a_plan(pics):
    plane, files = pics
    order = sorted(files)
    publish_plan(plane.paths, "pics", order)
    with _following(plane, threads=1) as first, _following(plane, threads=1) as second:  # two DataLoader workers
        for client, _, _ in (first, second):
            client.read(client.stat(order[0]), 0, 10)
        assert len(first[1].prefetchers) == 1 and second[1].prefetchers == {}
        assert first[1].cursors[0].position == second[1].cursors[0].position == 0  # both follow the plan
        first[0].close()  # the prefetching process goes: another takes the role at its next poll
        second[0].read(second[0].stat(order[1]), 0, 10)
        assert len(second[1].prefetchers) == 1
        taken = second[1].prefetchers[0]
        assert wait_until(lambda: taken.loaded >= AHEAD - 1, 10)  # it prefetches what is next, unread
        nxt = [second[0].stat(p) for p in order[2:4]]
        assert [second[0].cached_file_bytes(e) for e in nxt] == [e.size for e in nxt]
        publish_plan(plane.paths, "pics", order[::-1])  # and a new plan is prefetched by one process
        second[0].read(second[0].stat(order[-1]), 0, 10)
        assert len(second[1].prefetchers) == 1


def test_the_slowest_reader_on_the_node_sets_the_position(pics):
    plane, files = pics
    order = sorted(files)
    _, path = publish_plan(plane.paths, "pics", order)
    with _following(plane, threads=1) as (client, follower, recording):
        plans = os.path.dirname(path)
        client.read(client.stat(order[0]), 0, 10)
        (cursor,) = follower.cursors
        slow, stale = os.path.join(plans, ".pos-0-999998"), os.path.join(plans, ".pos-0-999999")
        with open(slow, "w") as f:  # another DataLoader worker, still on file 1
            f.write(f"{cursor.plan.created!r} 1")
        with open(stale, "w") as f:  # one that stopped reading long ago
            f.write(f"{cursor.plan.created!r} 0")
        os.utime(stale, (time.time() - 60, time.time() - 60))
        for p in order[1:4]:
            client.read(client.stat(p), 0, 10)
        assert (cursor.own, cursor.position) == (3, 1)
        with open(os.path.join(plans, f".pos-0-{os.getpid()}")) as f:
            assert f.read().split()[1] == "3"  # this process's own reads, as it reported them
        os.utime(slow, (time.time() - 60, time.time() - 60))  # it stopped too
        client.read(client.stat(order[4]), 0, 10)
        assert cursor.position == 4
        publish_plan(plane.paths, "pics", order[::-1])  # a new plan drops the old positions
        assert not os.path.exists(slow) and not os.path.exists(stale)


def test_the_window_follows_the_measured_pace():
    from datacache.plan.prefetch import Pace

    now = [0.0]
    pace = Pace(clock=lambda: now[0])
    assert pace.window(threads=4, mean_size=1000, bound=10**6, floor=100) == 10**6  # not measured yet
    pace.at(0)
    now[0] = 2.0
    pace.at(200)  # 100 files a second
    pace.fetched(0.05)  # 50 ms a fill: 5 files read meanwhile, 4 times over
    assert pace.rate == 100 and pace.window(threads=4, mean_size=1000, bound=10**6, floor=100) == 20_000
    assert pace.window(threads=64, mean_size=1000, bound=10**6, floor=100) == 64_000  # a file a thread
    assert pace.window(threads=4, mean_size=1000, bound=15_000, floor=100) == 15_000  # the quota's share caps it
    # ... except for what the reader read since its known position was reported (0.4 s: 40 files)
    assert pace.window(threads=4, mean_size=1000, bound=15_000, floor=100, lag_s=0.4) == 15_000 + 40_000
    pace.restart()  # the next plan: positions start again, the pace measured so far stays
    assert pace.window(threads=4, mean_size=1000, bound=10**6, floor=100) == 20_000
    pace.at(0)
    now[0] = 2.4
    pace.at(150)  # 375 files a second over 0.4 s: too short to measure
    assert pace.rate == 100
    now[0] = 2.5
    pace.at(150)  # 300 a second over 0.5 s, averaged with the rate before
    assert pace.rate == 200
