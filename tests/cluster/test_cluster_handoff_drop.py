"""A hand-off drops the holder's copy one tick after the owner took it, unless a peer's pull
counted on that copy meanwhile (the owner was drained and handed the block back: the copy is then
the only one). Seen as cachedPercentage 91% after 3 -> 5 -> 2 with readers running
(test_cluster_drain_many): the survivor answered "held" to the draining worker, which dropped its
copy, and the survivor's next tick dropped the block it had handed out a second earlier."""

from __future__ import annotations

import asyncio
import threading

from datacache.cluster.peers import Peers


def test_a_recalled_copy_is_kept_and_one_being_deleted_is_not_counted_on():
    peers = Peers("worker-0", router=None, client=None)  # the drop bookkeeping needs neither
    deleted: list[str] = []
    answers: dict[str, bool] = {}
    inside = threading.Event()

    def discard(key: str) -> None:
        if key == "ds/c/0":  # a pull arriving while this copy is being deleted
            answers["during"] = peers.recall(key)
            inside.set()
        deleted.append(key)

    peers._taken.update({"ds/a/0", "ds/b/0"})
    answers["pending"] = peers.recall("ds/a/0")  # a draining owner offers it back before the tick
    assert asyncio.run(peers._drop_taken(discard)) == ["ds/b/0"]
    assert deleted == ["ds/b/0"] and answers == {"pending": True}

    peers._taken.add("ds/c/0")
    assert asyncio.run(peers._drop_taken(discard)) == ["ds/c/0"]
    assert inside.is_set() and answers["during"] is False  # the puller is told no; it asks again later
    assert peers.recall("ds/c/0") is True  # deleted now: a later pull copies it in again as usual
