"""The runtime bound to a Dataset, as an engine: one interface for every cache engine.

As in Fluid (where AlluxioRuntime, JuiceFSRuntime, ThinRuntime ... each implement the same
``Engine`` interface of ``pkg/ddc/base``: Setup, ShouldSetupMaster/Workers, CheckRuntimeReady,
LoadData, UsedStorageBytes, Shutdown), runtimes are built by kind through one small factory
(:func:`engine_for`) and all answer the calls of :class:`Engine`:

- ``setup(dataset)``: start what the engine runs for ``dataset`` (idempotent);
- ``state()``: an :class:`EngineState`; "not ready yet" is a state, never an exception;
- ``opener(dataset)``: how the Dataset's mounts become filesystems for datacache's own read path
  (a ``datacache.ufs.mounts.MountOpener``; ``None``: each mount's URL through fsspec);
- ``mount_argv(dataset, mountpoint, options)``: the foreground command that mounts the dataset
  for a reader (``None``: datacache's own FUSE daemon);
- ``load(dataset, targets, on_progress, cancel)``: warm targets up (``None``: datacache's own
  warmup runs);
- ``report(dataset)``: an :class:`EngineReport` of files, bytes, cached bytes and capacity as
  the engine itself counts them (``None``: the control plane counts its own stores);
- ``usage()``: the engine's cache capacity and bytes used on this machine;
- ``scale(replicas)``: a note on what scaling does for this engine;
- ``teardown(clean_cache)``: stop everything it runs, and remove its cache when asked.

The interface and its value types live in :mod:`datacache.api.engine` (below the runtime
packages, which implement it). The built-in ``CacheRuntime`` is :class:`CacheEngine` (the control plane runs its workers,
warmup and status itself, so every call is the default); any other kind comes from the package
registered for it in entry-point group :data:`ENGINE_GROUP` (``ThinRuntime``:
``datacache_runtimes.thin_engine``, ``JuiceFSRuntime``: ``datacache_runtimes.juicefs_engine``),
a module with ``engine(runtime, profile, home)`` and ``stop_runtime(runtime, home)``. Plugins
register with the core; the core never imports them.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from datacache.api.engine import Engine
from datacache.errors import ResourceError

ENGINE_GROUP = "datacache.engines"
"""Entry-point group: runtime kind -> module providing ``engine`` and ``stop_runtime``."""


class CacheEngine(Engine):
    """The built-in cache runtime: mounts are read through their own URLs; the control plane runs
    its workers (``datacache.control.supervisor``), warmup and status."""


def _provider(kind: str):
    """The module registered for runtime ``kind``. Raises ``ResourceError`` naming the kind and
    what to install when there is none or it cannot be imported."""
    found = [ep for ep in entry_points(group=ENGINE_GROUP) if ep.name == kind]
    if not found:
        raise ResourceError(f"no engine for runtime kind {kind!r} is installed (entry-point group "
                            f"{ENGINE_GROUP!r}): pip install 'datacache[all]'")
    try:
        return found[0].load()
    except ImportError as err:
        raise ResourceError(f"the engine for runtime kind {kind!r} ({found[0].value}) cannot be loaded: {err}") from None


def engine_for(runtime, profile, home: str) -> Engine:
    """The engine of ``runtime`` (a CacheRuntime, a JuiceFSRuntime, or a ThinRuntime with its
    ``profile``); state of what it starts lives under ``home``. Raises ``ResourceError`` as
    :func:`_provider` does."""
    if runtime.kind == "CacheRuntime":
        return CacheEngine()
    return _provider(runtime.kind).engine(runtime, profile, home)


def stop_runtime(runtime, home: str) -> None:
    """Stop whatever ``runtime`` started (a thin runtime's FUSE command, JuiceFS's mount); needs no
    profile, so it works after the profile was deleted. Never raises for a runtime that runs nothing."""
    if runtime.kind != "CacheRuntime":
        _provider(runtime.kind).stop_runtime(runtime, home)
