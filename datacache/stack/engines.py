"""The runtime bound to a Dataset, as an engine: how its mounts open, whether it is ready, stop.

As in Fluid, runtimes are built by kind through one small factory (:func:`engine_for`), and all
answer the same three calls: ``opener(dataset)`` (how the Dataset's mounts become filesystems,
a ``datacache.ufs.mounts.MountOpener``; ``None``: each mount's URL through fsspec), ``ready()``
and ``stop()``. The built-in ``CacheRuntime`` is :class:`CacheEngine`; any other kind comes from
the package registered for it in entry-point group :data:`ENGINE_GROUP` (``ThinRuntime``:
``datacache_runtimes.thin_engine``), a module with ``engine(runtime, profile, home)`` and
``stop_runtime(runtime, home)``. Plugins register with the core; the core never imports them.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from datacache.errors import ResourceError

ENGINE_GROUP = "datacache.engines"
"""Entry-point group: runtime kind -> module providing ``engine`` and ``stop_runtime``."""


class CacheEngine:
    """The built-in cache runtime: mounts are read through their own URLs; nothing to run."""

    def opener(self, dataset):
        return None

    def ready(self) -> bool:
        return True

    def stop(self) -> None:
        pass


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


def engine_for(runtime, profile, home: str):
    """The engine of ``runtime`` (a CacheRuntime, or a ThinRuntime with its ``profile``); state of
    what it starts lives under ``home``. Raises ``ResourceError`` as :func:`_provider` does."""
    if runtime.kind == "CacheRuntime":
        return CacheEngine()
    return _provider(runtime.kind).engine(runtime, profile, home)


def stop_runtime(runtime, home: str) -> None:
    """Stop whatever ``runtime`` started (a thin runtime's FUSE command); needs no profile, so it
    works after the profile was deleted. Never raises for a runtime that runs nothing."""
    if runtime.kind != "CacheRuntime":
        _provider(runtime.kind).stop_runtime(runtime, home)
