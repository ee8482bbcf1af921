"""Eviction by next use (issue 21 item 3), against a small case checked by hand."""

from __future__ import annotations

import os

import pytest

from datacache.cache.blocks import file_id
from datacache.cache.disk import DiskTier
from datacache.manifest import FileEntry, Manifest
from datacache.plan.cursor import PlanCursor
from datacache.plan.nextuse import next_use_order
from datacache.plan.plan import Plan

MiB = 1 << 20
BS = 4 * MiB
NAMES = "ABCDEFZ"


def _case(order: str, position: int) -> tuple[PlanCursor, dict[str, str]]:
    """A cursor over plan ``order`` (file names from NAMES) at ``position``, and each file's block key."""
    entries = [FileEntry(f"{n}.bin", "m", f"/src/{n}.bin", BS, 0.0, "v1") for n in NAMES]
    cursor = PlanCursor(Plan("ds", tuple(f"{n}.bin" for n in order)), Manifest.from_entries(entries), BS)
    cursor.position = position
    return cursor, {e.path[0]: f"ds/{file_id(e.mount, e.ufs_path, e.version, BS)}/0" for e in entries}


def test_next_use_order_by_hand():
    cursor, key = _case("ZCAE", 0)  # Z read; next C, then A, then E; B and D never
    rows = [(key[n], BS) for n in "ABCDE"]  # LRU order, A least recent
    assert [k for k, _ in next_use_order(rows, [cursor])] == [key[n] for n in "BDEAC"]
    cursor.position = 2  # A just read: within a grace of 1 file with C, after B and D, before E (ahead)
    assert [k for k, _ in next_use_order(rows, [cursor], grace=1)] == [key[n] for n in "BDACE"]
    assert [k for k, _ in next_use_order(rows, [cursor], grace=0)] == [key[n] for n in "BCDAE"]
    cursor.position = 5  # past every grace: LRU order
    assert [k for k, _ in next_use_order(rows, [cursor], grace=1)] == [key[n] for n in "ABCDE"]


def test_two_plans_take_the_nearest_next_use():
    first, key = _case("ZCAE", 0)
    second, _ = _case("ZEBD", 0)  # another rank needs E next, then B, D
    rows = [(key[n], BS) for n in "ABCDE"]
    # distances: A 2, B 2, C 1, D 3, E min(3, 1) = 1
    assert [k for k, _ in next_use_order(rows, [first, second])] == [key[n] for n in "DABCE"]
    first.position = 3  # the first rank is done; the second still needs them
    assert [k for k, _ in next_use_order(rows, [first, second], grace=0)] == [key[n] for n in "ACDBE"]


@pytest.mark.parametrize("planned, survivors", [(True, "ACF"), (False, "DEF")])
def test_the_disk_tier_evicts_what_the_plan_needs_last(tmp_path, planned, survivors):
    """Five 4 MiB blocks fill a 22 MiB tier (high 95 %, low 60 %); the sixth evicts three (down to
    13.2 - 4 MiB). By the plan Z C A E (Z read): B and D are never needed, E is needed last, so A, C
    and F stay; by LRU A, B, C go."""
    cursor, key = _case("ZCAE", 0)
    tier = DiskTier(str(tmp_path / "cache"), 22 * MiB, high=0.95, low=0.6)
    try:
        if planned:
            tier.rank_victims = lambda rows: next_use_order(rows, [cursor])
        for n in "ABCDE":
            assert tier.put(key[n], os.urandom(BS))
        assert tier.evictions == 0
        assert tier.put(key["F"], os.urandom(BS))
        assert tier.evictions == 3
        assert {n for n in NAMES if key[n] in tier} == set(survivors)
    finally:
        tier.close()


def test_the_benchmarks_belady_bound_by_hand():
    from benchmarks.ordered import belady_hits

    sizes = dict.fromkeys("ABC", 1)
    # A B C | A B C with room for two: C (needed last) is never kept; A and B hit in epoch 2
    assert belady_hits([list("ABC"), list("ABC")], sizes, 2) == [0.0, 2 / 3]
    # C B A after A B C: C (needed first in epoch 2) is kept over A (needed last); C and B hit
    assert belady_hits([list("ABC"), list("CBA")], sizes, 2) == [0.0, 2 / 3]
    assert belady_hits([list("ABC"), list("ABC")], {"A": 1, "B": 1, "C": 3}, 2) == [0.0, 2 / 3]  # C never fits
