"""The read-ahead component (datacache.cache.readahead.ReadAhead) on its own: what it promises
about memory and waiting, with plain Python work (the block sources run it against moto and
workers in tests/cluster/test_block_source_contract.py)."""

from __future__ import annotations

import errno
import threading
import time

import pytest

from datacache.cache.budget import MemoryBudget
from datacache.cache.readahead import ReadAhead

BS = 1000


def test_fills_a_close_cancels_give_their_memory_back_and_fail_their_waiters():
    ra = ReadAhead(MemoryBudget(10 * BS), BS, fill_threads=1, load_threads=1)
    started, go = threading.Event(), threading.Event()

    def slow():
        started.set()
        go.wait(30)
        return b"a" * BS

    running = ra.load("a", BS, slow, wait=False)
    queued = ra.load("b", BS, lambda: b"b" * BS, wait=False)  # behind "a" in the one fill thread
    assert started.wait(30) and ra.budget.used == 2 * BS
    assert ra.load("b", BS, lambda: b"never", wait=False) is queued  # single-flight: joined
    closing = threading.Thread(target=ra.close)
    closing.start()
    with pytest.raises(OSError) as info:
        queued.result(30)
    assert info.value.errno == errno.ECANCELED
    go.set()
    closing.join(30)
    assert not closing.is_alive() and running.result() == b"a" * BS
    assert ra.budget.used == 0 and ra.flights.joined("b") is None
    assert ra.load("c", BS, lambda: b"c", wait=False) is None  # closed: read-ahead is skipped
    assert not ra.keep("c", BS, lambda: b"c")


def test_the_buffer_keeps_half_the_budget_drops_the_oldest_and_hands_holds_over():
    ra = ReadAhead(MemoryBudget(8 * BS), BS)  # bound: 4 blocks kept
    try:
        for i in range(4):
            assert ra.keep(i, BS, lambda i=i: bytes([i]) * BS)
        assert ra.keep(4, BS, lambda: b"\x04" * BS)  # drops block 0, the oldest
        assert ra.take(0) is None
        assert ra.take(1) == b"\x01" * BS  # given back: 3 kept
        assert ra.budget.used == 3 * BS
        held = ra.take(2, release=False)  # the caller now holds its bytes
        assert held == b"\x02" * BS and ra.budget.used == 3 * BS
        ra.budget.release(len(held))
        assert _landed(ra, 3) and _landed(ra, 4)
        ra.drop(3)
        ra.drop(3)  # twice: nothing more given back
        assert ra.budget.used == BS and not ra.ready(3)
        ra.drop(4)
        assert ra.budget.used == 0
        assert ra.budget.hold(4 * BS)  # half the budget held elsewhere: nothing kept ahead
        assert not ra.keep(5, BS, lambda: b"x")
        ra.budget.release(4 * BS)
        assert ra.keep(6, BS, lambda: 1 / 0) and ra.take(6) is None  # a failed load: the caller reads
        assert ra.budget.used == 0 and ra.budget.peak <= ra.budget.limit
    finally:
        ra.close()


def _landed(ra: ReadAhead, key) -> bool:
    deadline = time.monotonic() + 30
    while not ra.ready(key) and time.monotonic() < deadline:
        time.sleep(0.01)
    return ra.ready(key)
