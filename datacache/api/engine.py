"""The engine interface every runtime implements (see :mod:`datacache.stack.engines` for the
factory and what each call means): :class:`Engine`, :class:`EngineState`, :class:`EngineReport`.

It sits in the API layer so that runtime packages (``datacache_runtimes``) implement it without
importing the read-path stack that calls them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineState:
    """Whether an engine serves: ``phase`` ``Ready``, ``NotReady`` (starting, or stopped: not an
    error) or ``Failed`` (it cannot work until its spec or environment changes); ``reason`` says
    why when not Ready (one line, never a credential)."""

    phase: str = "Ready"
    reason: str = ""

    @property
    def ready(self) -> bool:
        return self.phase == "Ready"


@dataclass(frozen=True)
class EngineReport:
    """What an engine counts itself for one dataset: ``files`` and ``ufs_total`` (bytes) in its
    UFS, ``cached`` (bytes held in its cache now), ``cached_percentage`` as the engine prints it
    (``"42.0%"``; None: computed from bytes) and ``capacity`` (bytes of cache configured)."""

    files: int
    ufs_total: int
    cached: int
    capacity: int
    cached_percentage: str | None = None


class Engine:
    """The calls every engine answers (module docstring); the defaults are the built-in engine's:
    the control plane's own read path, FUSE daemon, warmup and status.

    ``reads_through_datacache``: whether ``datacache://`` and datacache's block cache read the
    dataset (False: the engine's own client is the only read path, ``mount_argv``)."""

    reads_through_datacache = True

    def setup(self, dataset) -> None:
        """Start what the engine runs for ``dataset``; raises ``ResourceError`` when it cannot."""

    def state(self) -> EngineState:
        return EngineState()

    def ready(self) -> bool:
        """``state().ready``."""
        return self.state().ready

    def opener(self, dataset):
        return None

    def mount_argv(self, dataset, mountpoint: str, options=()) -> list[str] | None:
        return None

    def reader_mounts(self) -> list[str]:
        """Mount points of readers' mounts that the engine's own clients serve (``mount_argv``);
        datacache's own FUSE mounts are found by their fsname instead."""
        return []

    def load(self, dataset, targets: list[str], on_progress=None, cancel=None):
        return None

    def report(self, dataset) -> EngineReport | None:
        return None

    def usage(self) -> tuple[int, int] | None:
        """``(capacity, used)`` bytes of the engine's cache on this machine (None: the control
        plane measures its own stores)."""
        return None

    def scale(self, replicas: int) -> str:
        """A note on what ``replicas`` means for this engine, after the control plane stored it
        ('' when the control plane's own worker supervision says it all)."""
        return ""

    def teardown(self, clean_cache: bool = True) -> None:
        """Stop what the engine runs (no-op when nothing runs); never raises for that."""
