"""SingleFlight: one run per key at a time, its value or error handed to every caller."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from datacache.cache.singleflight import SingleFlight


def _call(flights: SingleFlight, key, work):
    fut, mine = flights.claim(key)
    if mine:
        flights.run(key, fut, work)
    return fut.result(timeout=10), mine


def test_callers_arriving_while_a_run_is_in_flight_share_it_and_the_key_is_free_after():
    flights, gate, runs = SingleFlight(), threading.Event(), []

    def work():
        runs.append(1)
        gate.wait(10)
        return b"block"

    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(_call, flights, "k", work)
        while flights.joined("k") is None:  # the first call holds the run
            pass
        calls = [first] + [pool.submit(_call, flights, "k", work) for _ in range(7)]
        gate.set()
        results = [c.result(10) for c in calls]
    assert [r[0] for r in results] == [b"block"] * 8
    assert sum(r[1] for r in results) == len(runs) == 1  # one caller ran it
    assert flights.joined("k") is None
    assert _call(flights, "k", lambda: b"again") == (b"again", True)  # a later call runs anew


def test_an_error_reaches_every_waiter_and_other_keys_run_on_their_own():
    flights = SingleFlight()
    fut, mine = flights.claim("bad")
    assert mine and flights.claim("bad") == (fut, False)
    other, mine_other = flights.claim("good")
    assert mine_other and other is not fut

    def gone():
        raise FileNotFoundError(2, "gone", "f.bin")

    flights.run("bad", fut, gone)
    with pytest.raises(FileNotFoundError, match="gone"):
        fut.result()
    assert flights.joined("bad") is None and flights.joined("good") is other
    flights.settle("good", other, b"x")
    assert other.result() == b"x" and flights.joined("good") is None
