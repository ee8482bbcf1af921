"""Rendezvous placement: balanced, deterministic, and adding or removing one worker moves only
that worker's share of blocks (about 1/N), measured over many keys."""

from __future__ import annotations

from collections import Counter

import pytest

from datacache.cache.blocks import BlockKey, file_id
from datacache.cluster.placement import owners, rank

KEYS = [str(BlockKey("ds", file_id("m", f"bucket/f{f}", "v1", 4 << 20), i)) for f in range(500) for i in range(40)]


def _owner_map(workers):
    return {k: owners(k, workers)[0] for k in KEYS}


def test_each_of_n_workers_owns_about_one_nth():
    for n in (2, 3, 4, 8):
        workers = [f"worker-{i}" for i in range(n)]
        share = Counter(_owner_map(workers).values())
        for w in workers:
            assert abs(share[w] / len(KEYS) - 1 / n) < 0.1 / n, (n, share)


def test_placement_is_deterministic_and_independent_of_list_order():
    a = ["worker-0", "worker-1", "worker-2"]
    assert [rank(k, a) for k in KEYS[:200]] == [rank(k, list(reversed(a))) for k in KEYS[:200]]


@pytest.mark.parametrize("n", [3, 5])
def test_adding_a_worker_moves_about_one_over_n_plus_one_all_to_it(n):
    before = _owner_map([f"worker-{i}" for i in range(n)])
    after = _owner_map([f"worker-{i}" for i in range(n + 1)])
    moved = [k for k in KEYS if before[k] != after[k]]
    assert abs(len(moved) / len(KEYS) - 1 / (n + 1)) < 0.02
    assert {after[k] for k in moved} == {f"worker-{n}"}


def test_removing_workers_moves_only_their_blocks():
    four = _owner_map(["worker-0", "worker-1", "worker-2", "worker-3"])
    two = _owner_map(["worker-0", "worker-1"])
    moved = [k for k in KEYS if four[k] != two[k]]
    assert {four[k] for k in moved} == {"worker-2", "worker-3"}
    assert abs(len(moved) / len(KEYS) - 1 / 2) < 0.02
    # Each removed worker's blocks go to their runner-up, spread over the survivors.
    assert all(two[k] == [w for w in rank(k, ["worker-0", "worker-1", "worker-2", "worker-3"])
                          if w in ("worker-0", "worker-1")][0] for k in moved)


def test_replicas_are_distinct_and_a_prefix_of_the_failover_order():
    workers = [f"worker-{i}" for i in range(5)]
    for k in KEYS[:500]:
        three = owners(k, workers, 3)
        assert len(set(three)) == 3 and three == rank(k, workers)[:3]
    assert owners(KEYS[0], ["worker-0"], 3) == ["worker-0"]
    with pytest.raises(ValueError):
        owners(KEYS[0], workers, 0)
