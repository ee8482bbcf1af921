"""Placement: which cache workers own a block — rendezvous (highest-random-weight) hashing.

Why HRW and not a consistent-hash ring: every client computes the same owner from nothing but the
block key and the set of live worker ids, with no ring to build, no virtual nodes to tune and no
shared state to keep in sync. Each worker scores ``xxh3_64(worker_id NUL key)``; the highest score
owns the block, the next ones are its replicas and the failover order. When a worker joins it
takes over exactly the blocks where it now scores highest (about 1/N of them, from every old
worker evenly); when one leaves only its own blocks move, each to its own runner-up. Cost is
O(N) per key, which for tens of workers is a few microseconds.

Blocks away from home. A block can sit on a worker that is not (or no longer) its owner: the owner
was down when it was filled (failover puts it on the runner-up), or a worker joined and now outranks
the old owner. HRW bounds where such a block can be: removing the workers that joined or were down
makes it the owner again, so it sits among the first few candidates of the current ranking. So a
lookup asks the first ``LOOKUP_DEPTH`` candidates (the owner, then the runners-up; read-repair on
the owner, counting for status), and each worker moves blocks it does not own to their owner in
the background (hand-off), after which every block is on its owner again.

Workers are ranked by their *id* (``worker-3``), not their address, so a worker restarted on a new
port keeps owning the blocks in its cache directory.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import xxhash

LOOKUP_DEPTH = 3  # candidates searched for a block: the owner and two runners-up


def score(worker_id: str, key: str) -> int:
    """The 64-bit HRW weight of ``worker_id`` for block key ``key`` (``str(BlockKey)``)."""
    return xxhash.xxh3_64_intdigest(f"{worker_id}\0{key}".encode())


def rank(key: str, worker_ids: Iterable[str]) -> list[str]:
    """Every worker id, best owner of ``key`` first (ties, vanishingly rare, broken by id)."""
    return sorted(worker_ids, key=lambda w: (score(w, key), w), reverse=True)


def owners(key: str, worker_ids: Sequence[str], replicas: int = 1) -> list[str]:
    """The ``replicas`` workers that hold ``key`` (fewer when fewer workers exist).

    Raises ``ValueError`` when ``replicas`` < 1.
    """
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, got {replicas}")
    return rank(key, worker_ids)[:replicas]


def lookup(key: str, worker_ids: Iterable[str], replicas: int = 1) -> list[str]:
    """The workers where ``key`` may be held, in the order to look: its ``replicas`` owners, then
    ``LOOKUP_DEPTH - 1`` runners-up (see the module docstring)."""
    return rank(key, worker_ids)[:replicas + LOOKUP_DEPTH - 1]
