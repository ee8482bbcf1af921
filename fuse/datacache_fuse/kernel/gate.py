"""How many of a session's worker threads read ``/dev/fuse`` at once: a few, plus one more for each
reading thread held up by a slow request.

Why few: every thread waiting in ``read(/dev/fuse)`` is woken for a request of its own, so with 16
waiting threads each request costs a wake-up (on this VM often of the other CPU, ~60 us) and a GIL
hand-off between threads; with 2, a thread that finishes a request mostly finds the next one queued
and takes it without sleeping. Measured (2,000 x 100 KB files, no-open mode, 4 reader processes,
page cache dropped): 16 readers 2.0-2.7k files/s at 0.8-1.05 s of daemon CPU per pass; 2 readers
3.1-3.4k files/s at 0.55 s; 1 reader 2.4-2.8k; 3 readers 3.0-3.4k; 4 readers 2.9-3.1k.

Why more when held up: a READ of a block not yet cached waits on the UFS or a worker (tens of
milliseconds); the requests behind it must not wait too. A watcher thread lets one more worker read
for every reading worker whose request has run longer than ``stuck_after`` seconds; that worker,
once its request is answered, waits for a free turn before it reads again. This is how Go's
runtime keeps its processors busy while a goroutine blocks in a system call (``sysmon`` retakes the
processor of a thread in a system call for over one of its ticks, 20 us to 10 ms); here the unit is a
turn to read ``/dev/fuse``.
"""

from __future__ import annotations

import threading
import time

STUCK_AFTER_S = 0.002  # a request running longer than this lets another worker read
IDLE_AFTER_S = 1.0  # no request seen for this long: the watcher sleeps until the next one


class Turn:
    """One worker's state in the gate: ``started`` (``time.monotonic()`` of the request being
    answered, 0.0 between requests), ``handed_off`` (its turn was given to another worker while
    it was held up)."""

    __slots__ = ("started", "handed_off")

    def __init__(self):
        self.started = 0.0
        self.handed_off = False


class ReaderGate:
    """At most ``readers`` workers (plus one per held-up one) read requests at a time.

    A worker calls :meth:`join` before its first read (it may wait there for a turn), brackets
    each request with :meth:`begin` and :meth:`end` (``end`` waits for a turn again if the
    worker's was handed off), and calls :meth:`leave` when it stops for good (its turn goes to a
    waiting worker, so that each one in turn reads, finds the connection gone and leaves).
    :meth:`watch` is the watcher thread's body; it returns once every worker has left.
    """

    def __init__(self, readers: int = 2, stuck_after: float = STUCK_AFTER_S, idle_after: float = IDLE_AFTER_S):
        if readers < 1:
            raise ValueError(f"readers={readers}: at least one worker must read requests")
        self.readers = readers
        self.stuck_after = stuck_after
        self.idle_after = idle_after
        self.handoffs = 0  # turns handed to another worker (held-up requests)
        self._turns = threading.Semaphore(readers)
        self._lock = threading.Lock()
        self._workers: list[Turn] = []
        self._joined = 0
        self._left = 0
        self._idle = False  # the watcher sleeps until a request begins
        self._wake = threading.Event()

    def join(self) -> Turn:
        """Register the calling worker and wait for its first turn to read."""
        turn = Turn()
        with self._lock:
            self._workers.append(turn)
            self._joined += 1
        self._turns.acquire()
        return turn

    def begin(self, turn: Turn) -> None:
        """The worker starts answering a request (after reading it)."""
        turn.started = time.monotonic()
        if self._idle:
            self._idle = False
            self._wake.set()

    def end(self, turn: Turn) -> None:
        """The request is answered; waits for a turn if this worker's was handed off meanwhile."""
        turn.started = 0.0
        if turn.handed_off:
            self._turns.acquire()
            turn.handed_off = False

    def leave(self, turn: Turn) -> None:
        """The worker stops (the session is over); its turn goes to a waiting worker."""
        turn.started = 0.0
        with self._lock:
            self._left += 1
            done = self._left == self._joined
        if not turn.handed_off:
            self._turns.release()
        if done:
            self._wake.set()

    @property
    def over(self) -> bool:
        """Every worker that joined has left."""
        with self._lock:
            return self._joined > 0 and self._left == self._joined

    def watch(self) -> None:
        """Hand a turn to a waiting worker for each reading worker held up longer than
        ``stuck_after``; checks every ``stuck_after`` seconds while requests come, sleeps once
        none has run for ``idle_after`` seconds. Returns when every worker has left."""
        quiet_since = time.monotonic()
        while not self.over:
            if self._idle:
                self._wake.wait(self.idle_after)
                self._wake.clear()
                quiet_since = time.monotonic()
                continue
            time.sleep(self.stuck_after)
            now = time.monotonic()
            busy = False
            for turn in list(self._workers):
                started = turn.started
                if not started:
                    continue
                busy = True
                if not turn.handed_off and now - started > self.stuck_after:
                    turn.handed_off = True
                    self.handoffs += 1
                    self._turns.release()
            if busy:
                quiet_since = now
            elif now - quiet_since > self.idle_after:
                self._idle = True
