"""A registered cache worker, as membership (heartbeat table or DNS) lists it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Member:
    """One registered worker.

    ``worker_id`` (``worker-<i>``, the placement identity), ``url`` (``http://host:port``), ``node``
    (host name, for short-circuit reads), ``pid``, ``disk`` (its disk level: ``{"path", "quota",
    "high", "low", "medium"}``, or ``{}`` for a MEM-only worker), ``heartbeat`` (seconds).
    """

    worker_id: str
    url: str
    node: str
    pid: int
    disk: dict = field(default_factory=dict)
    heartbeat: float = 0.0
    draining: bool = False

    @property
    def index(self) -> int:
        return int(self.worker_id.rsplit("-", 1)[-1])
