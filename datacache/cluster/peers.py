"""A worker's peers: finding blocks held away from home, and handing them back to their owners.

A block is not always on its HRW owner (see :mod:`.placement`): the owner was down when it was
filled, or a worker joined and outranks the old owner, or the runtime was scaled out from one
in-process cache that became ``worker-0``. Two mechanisms, both bounded, bring it back:

- **Read-repair.** On a miss the owner asks the other workers among the block's first
  ``LOOKUP_DEPTH`` candidates (``GET /v1/block?key=``, which never fills) before the UFS; a block
  found there is copied into the owner's store and served. A block fill of a warmup does the same
  with one batched existence query per peer. So a failover or a scale-up costs copies between
  workers, never a refetch from the UFS.
- **Hand-off.** Each worker scans its blocks when the set of live workers changes (and every
  ``HANDOFF_PERIOD_S`` seconds anyway) and asks each block's owner to pull the blocks it holds for
  it (``POST /v1/pull``, at most ``HANDOFF_BATCH`` keys a request); the owner copies them only if
  it agrees that it is the owner (no ping-pong while two workers see different members), and the
  holder drops its copy once the owner holds it, one ``HANDOFF_CHECK_S`` tick later (so a status
  count, which asks owner and holder at about the same time, sees the block on one side or the
  other while it moves). Each block then sits on its owner alone.

One replica per block is assumed here, as :func:`datacache.cluster.source.connect` places them.
Peers are asked with the runtime's own token; their answers are verified by checksum.
"""

from __future__ import annotations

import asyncio
import logging
import time

from datacache.cluster import placement
from datacache.cluster.client import WorkerClient, WorkerRejected, WorkerUnavailable
from datacache.cluster.membership import Member
from datacache.cluster.routing import Router

log = logging.getLogger("datacache.worker")

HANDOFF_BATCH = 256  # keys per pull request
HANDOFF_CHECK_S = 1.0  # how often the live set is compared with the last pass's
HANDOFF_PERIOD_S = 30.0  # a pass at least this often: blocks filled away from home meanwhile


class Peers:
    """The other workers of worker ``me``, found through ``router``, asked with ``client`` (both
    used on the worker's event loop)."""

    def __init__(self, me: str, router: Router, client: WorkerClient):
        self.me = me
        self.router = router
        self.client = client
        self._taken: list[str] = []  # blocks owners took: this worker's copies go at the next tick

    def _others(self, key: str) -> list[Member]:
        return [m for m in self.router.lookup(key) if m.worker_id != self.me]

    async def find(self, key: str) -> bytes | None:
        """Block ``key`` from the first other candidate holding it, or None."""
        for member in self._others(key):
            data = await self._get(member, key)
            if data is not None:
                return data
        return None

    async def find_many(self, keys: list[str]) -> dict[str, bytes]:
        """Blocks of ``keys`` held by other candidates (one existence query per peer): key -> bytes."""
        asks: dict[str, tuple[Member, list[str]]] = {}
        for key in keys:
            for member in self._others(key):
                asks.setdefault(member.worker_id, (member, []))[1].append(key)
        answers = await asyncio.gather(*(self.client.exists(m.url, m.worker_id, ks) for m, ks in asks.values()),
                                       return_exceptions=True)
        found: dict[str, bytes] = {}
        for (member, ks), held in zip(asks.values(), answers):
            if isinstance(held, BaseException):
                self._failed(member, held)
                continue
            for key, there in zip(ks, held):
                if there and key not in found:
                    data = await self._get(member, key)
                    if data is not None:
                        found[key] = data
        return found

    async def pull_from(self, holder_id: str, key: str) -> bytes | None:
        """Block ``key`` from live worker ``holder_id`` (None if it is not live or lacks it)."""
        holder = next((m for m in self.router.healthy() if m.worker_id == holder_id), None)
        return None if holder is None else await self._get(holder, key)

    def owns(self, key: str) -> bool:
        """Whether this worker is ``key``'s owner among the live workers (none listed: not yet, as
        before a new pod's first readiness shows it in DNS)."""
        return placement.owners(key, [m.worker_id for m in self.router.members()])[:1] == [self.me]

    async def handoff(self, keys: list[str]) -> tuple[int, bool]:
        """Ask the owners of ``keys`` this worker does not own to pull them; the copies they took
        are dropped at the next tick of :meth:`run_handoff`. Returns ``(blocks moved, whether
        every owner answered)``."""
        members = {m.worker_id: m for m in self.router.healthy()}
        if self.me not in members:
            return 0, False
        by_owner: dict[str, list[str]] = {}
        for key in keys:
            owner = placement.owners(key, members)[0]
            if owner != self.me:
                by_owner.setdefault(owner, []).append(key)
        moved, complete = 0, True
        for owner, mine in by_owner.items():
            member = members[owner]
            for start in range(0, len(mine), HANDOFF_BATCH):
                batch = mine[start:start + HANDOFF_BATCH]
                try:
                    taken = await self.client.pull(member.url, owner, self.me, batch)
                except (WorkerUnavailable, WorkerRejected) as err:
                    self._failed(member, err)
                    complete = False
                    break
                for key, ok in zip(batch, taken):
                    if ok:
                        self._taken.append(key)
                        moved += 1
        return moved, complete

    async def run_handoff(self, list_keys, discard) -> None:
        """Forever: a hand-off pass (``list_keys()`` in a thread gives this worker's keys) when the
        live workers change, after a failed pass, or every ``HANDOFF_PERIOD_S`` seconds; at each
        tick ``discard(key)`` (in a thread) drops the copies owners took in the pass before."""
        seen, last = None, float("-inf")
        while True:
            await asyncio.sleep(HANDOFF_CHECK_S)
            taken, self._taken = self._taken, []
            for key in taken:
                await asyncio.to_thread(discard, key)
            live = frozenset((m.worker_id, m.pid) for m in self.router.members())
            if live == seen and time.monotonic() - last < HANDOFF_PERIOD_S:
                continue
            try:
                moved, complete = await self.handoff(await asyncio.to_thread(list_keys))
            except Exception:  # logged; the next pass retries
                log.exception("hand-off pass failed")
                continue
            if moved:
                log.info("handed %d blocks to their owners", moved)
            if complete:
                seen, last = live, time.monotonic()

    async def _get(self, member: Member, key: str) -> bytes | None:
        try:
            data = await self.client.get_key(member.url, member.worker_id, key)
        except (WorkerUnavailable, WorkerRejected, PermissionError) as err:
            self._failed(member, err)
            return None
        self.router.trust(member)
        return data

    def _failed(self, member: Member, err: BaseException) -> None:
        if isinstance(err, WorkerUnavailable):
            self.router.suspect(member)
        log.warning("peer %s: %s", member.worker_id, err)

    async def close(self) -> None:
        await self.client.close()
        self.router.close()
