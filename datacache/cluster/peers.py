"""A worker's peers: finding blocks held away from home, and handing them back to their owners.

A block is not always on its HRW owner (see :mod:`.placement`): the owner was down when it was
filled, or a worker joined and outranks the old owner, or the runtime was scaled out from one
in-process cache that became ``worker-0``. Two mechanisms, both bounded, bring it back, and a
third empties a worker before a scale-in removes it:

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
  other while it moves), unless a peer's pull counted on that copy meanwhile (:meth:`Peers.recall`:
  the owner was drained and handed the block back). Each block then sits on its owner alone.
- **Drain** (before a scale-in stops a worker). The control plane takes the worker out of the
  members placement ranks (``Membership.drain``): reads and warmups go to the workers that stay,
  whose read-repair also asks draining workers. Then the worker offers each of its blocks to its
  new owner among the workers that stay (never another leaving one) the same way (``POST
  /v1/pull``, checksums verified by the owner) and drops its copy once the owner holds it, listing
  its blocks again each pass until none is left or a deadline passes; from the start of its drain
  it stores nothing (clients with an older view of the members still reach it: their reads are
  served, not kept), so a finished drain leaves no current block behind. It reports what it moved,
  what it could not move and why (:meth:`Peers.drain`).

One replica per block is assumed here, as :func:`datacache.cluster.worker_source.connect` places them.
Peers are asked with the runtime's own token; their answers are verified by checksum.
"""

from __future__ import annotations

import asyncio
import logging
import time

from datacache.cluster import placement
from datacache.cluster.worker_client import WorkerClient, WorkerRejected, WorkerUnavailable
from datacache.cluster.member import Member
from datacache.cluster.routing import Router

log = logging.getLogger("datacache.worker")

HANDOFF_BATCH = 256  # keys per pull request at most
HANDOFF_BATCH_BYTES = 32 << 20  # and at most this many bytes of blocks: the owner answers within a peer timeout
HANDOFF_CHECK_S = 1.0  # how often the live set is compared with the last pass's
HANDOFF_PERIOD_S = 30.0  # a pass at least this often: blocks filled away from home meanwhile
DRAIN_RETRY_S = 0.5  # pause between the passes of a drain
DRAIN_SETTLE_S = 3.0  # peers refresh their view of the members every second (Router.refresh_s)


class Peers:
    """The other workers of worker ``me``, found through ``router``, asked with ``client`` (both
    used on the worker's event loop)."""

    def __init__(self, me: str, router: Router, client: WorkerClient):
        self.me = me
        self.router = router
        self.client = client
        self._taken: set[str] = set()  # blocks owners took: this worker's copies go at the next tick
        self._dropping: set[str] = set()  # of those, the one being deleted now
        self.draining = False

    async def view(self) -> None:
        """Bring this worker's view of the members up to date (``Router.members``, when it is
        due) in a thread. The worker's other calls then read it from the router's cache: a
        membership read may block (a DNS lookup; a DaemonSet's targets are identified by asking
        each worker's ``/healthz``), and from the event loop two workers asking each other would
        each hold the other's answer back until the timeout."""
        await asyncio.to_thread(self.router.members)

    def _others(self, key: str) -> list[Member]:
        """Where else ``key`` may be: its first candidates, then workers being drained."""
        return [m for m in self.router.lookup(key) + self.router.draining() if m.worker_id != self.me]

    async def find(self, key: str) -> bytes | None:
        """Block ``key`` from the first other candidate holding it, or None. Candidates that joined
        after this worker's last view of the members, and before this call, are asked too (a
        scale-out's new owner must find what the old workers hold, not refetch it)."""
        since, asked = time.monotonic(), set()
        await self.view()
        while True:
            for member in self._others(key):
                if member.url not in asked:
                    asked.add(member.url)
                    data = await self._get(member, key)
                    if data is not None:
                        return data
            if not await asyncio.to_thread(self.router.refresh_since, since):
                return None

    async def find_many(self, keys: list[str]) -> dict[str, bytes]:
        """Blocks of ``keys`` held by other candidates (one existence query per peer, on a view of
        the members read after this call began): key -> bytes."""
        await asyncio.to_thread(self.router.refresh_since, time.monotonic())
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
        """Block ``key`` from live (or draining) worker ``holder_id`` (None if it is neither or lacks
        it)."""
        await self.view()
        holder = next((m for m in self.router.healthy() + self.router.draining() if m.worker_id == holder_id), None)
        return None if holder is None else await self._get(holder, key)

    def owns(self, key: str) -> bool:
        """Whether this worker is ``key``'s owner among the live workers (none listed: not yet, as
        before a new pod's first readiness shows it in DNS)."""
        return placement.owners(key, [m.worker_id for m in self.router.members()])[:1] == [self.me]

    async def handoff(self, keys: list[str]) -> tuple[int, bool]:
        """Ask the owners of ``keys`` this worker does not own to pull them; the copies they took
        are dropped at the next tick of :meth:`run_handoff`. Returns ``(blocks moved, whether
        every owner answered)``."""
        await self.view()
        members = {m.worker_id: m for m in self.router.healthy()}
        if self.me not in members:
            return 0, False
        taken, errors = await self._offer(keys, members)
        self._taken.update(taken)
        return len(taken), not errors

    def recall(self, key: str) -> bool:
        """A peer is about to count on this worker's copy of ``key`` (its pull found it here):
        the copy is no longer dropped at the next tick, since the owner it went to may be
        draining and hand it back. False while the copy is being deleted (the peer retries)."""
        if key in self._dropping:
            return False
        self._taken.discard(key)
        return True

    async def _drop_taken(self, discard) -> list[str]:
        """Delete (``discard(key)``, in a thread) the copies owners took since the last tick and
        no peer recalled; returns their keys."""
        dropped = []
        while self._taken:
            key = self._taken.pop()
            self._dropping.add(key)
            try:
                await asyncio.to_thread(discard, key)
            finally:
                self._dropping.discard(key)
            dropped.append(key)
        return dropped

    async def drain(self, list_keys, discard, settled, seconds: float) -> dict:
        """Hand every block this worker holds (``list_keys()``, in a thread: the keys on its disk
        now) to its owner among the live workers that stay, this one being out of placement
        already (``Membership.drain``), and drop each copy (``discard(key)``, in a thread) as soon
        as its owner holds it. Every pass lists the keys again, so a block stored after the
        drain began (a fill or pull started before, a reader with an old view of the members)
        is handed off too; the drain ends only when a listing is empty while ``settled()`` (no
        store write in flight), when ``seconds`` have passed, or when a pass moved nothing after
        ``DRAIN_SETTLE_S`` seconds (every view is fresh by then: what is left, an owner that
        fails or refuses, stays left). Owners are ranked among the live workers of a fresh view
        of the members, minus every worker being drained, so no block goes to another leaving
        worker. Passes repeat every ``DRAIN_RETRY_S`` seconds.

        Returns ``{"blocks": distinct keys moved or left (one that vanished another way, evicted
        or dropped by a hand-off pass that ended as the drain began, is not counted), "moved": n
        held by their owners now, "left": n still here, "seconds": elapsed, "errors": {owner id:
        "<n> blocks: <why>"}}``."""
        self.draining = True
        started = time.monotonic()
        await asyncio.to_thread(self.router.refresh)  # the control plane marked every leaving worker before this call
        moved: set[str] = set()
        left: list[str] = []
        errors: dict[str, str] = {}
        offered: dict[str, Member] = {}  # the owners of the last pass, who the reasons name
        while True:
            moved.update(await self._drop_taken(discard))  # a hand-off pass that ended after the drain began
            left = await asyncio.to_thread(list_keys)
            await self.view()
            leaving = {m.worker_id for m in self.router.draining()} | {self.me}
            members = {m.worker_id: m for m in self.router.members() if m.worker_id not in leaving}
            offered = offered or members
            elapsed = time.monotonic() - started
            if not left and settled():
                break
            if not members or elapsed >= seconds:
                break
            if not left:
                await asyncio.sleep(DRAIN_RETRY_S)  # a store write in flight: list again once it lands
                continue
            offered = members
            taken, errors = await self._offer(left, members)
            for key in taken:
                await asyncio.to_thread(discard, key)
            moved.update(taken)
            left = [k for k in left if k not in moved]
            if not taken and elapsed >= DRAIN_SETTLE_S:
                break
            await asyncio.sleep(DRAIN_RETRY_S if left else 0)
        why: dict[str, int] = {}
        for key in left:
            owner = placement.owners(key, offered)[0] if offered else "*"
            why[owner] = why.get(owner, 0) + 1
        reasons = {o: f"{n} blocks: " + (errors.get(o) or ("no other live worker" if o == "*" else
                                                          "refused (it could not store them, or does not rank itself "
                                                          "their owner)")) for o, n in why.items()}
        return {"blocks": len(moved | set(left)), "moved": len(moved - set(left)), "left": len(left),
                "seconds": round(time.monotonic() - started, 3), "errors": reasons}

    async def _offer(self, keys: list[str], members: dict[str, Member]) -> tuple[list[str], dict[str, str]]:
        """Ask the owner among ``members`` (id -> Member) of each of ``keys`` to pull it from this
        worker (owners in parallel; at most ``HANDOFF_BATCH`` keys and ``HANDOFF_BATCH_BYTES`` a
        request). Returns ``(keys their owners hold now, {owner id: error} for owners that failed)``."""
        by_owner: dict[str, list[str]] = {}
        for key in keys:
            owner = placement.owners(key, members)[0]
            if owner != self.me:
                by_owner.setdefault(owner, []).append(key)
        results = await asyncio.gather(*(self._offer_to(members[o], ks) for o, ks in by_owner.items()))
        taken = [key for keys_taken, _ in results for key in keys_taken]
        return taken, {o: err for o, (_, err) in zip(by_owner, results) if err}

    async def _offer_to(self, member: Member, keys: list[str]) -> tuple[list[str], str]:
        """``(keys ``member`` holds now, its error or '')``; stops at its first failure."""
        taken: list[str] = []
        step = max(1, min(HANDOFF_BATCH, HANDOFF_BATCH_BYTES // self.client.block_size))
        for start in range(0, len(keys), step):
            batch = keys[start:start + step]
            try:
                held = await self.client.pull(member.url, member.worker_id, self.me, batch)
            except (WorkerUnavailable, WorkerRejected) as err:
                self._failed(member, err)
                return taken, str(err)
            taken += [key for key, ok in zip(batch, held) if ok]
        return taken, ""

    async def run_handoff(self, list_keys, discard) -> None:
        """Forever: a hand-off pass (``list_keys()`` in a thread gives this worker's keys) when the
        live workers change, after a failed pass, or every ``HANDOFF_PERIOD_S`` seconds; at each
        tick ``discard(key)`` (in a thread) drops the copies owners took in the pass before."""
        seen, last = None, float("-inf")
        while True:
            await asyncio.sleep(HANDOFF_CHECK_S)
            if self.draining:  # :meth:`drain` moves (and drops) everything now
                continue
            await self._drop_taken(discard)
            await self.view()
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
