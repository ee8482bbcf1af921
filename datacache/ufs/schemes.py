"""The URL schemes a mount may use: fsspec's, ``file``/``local``, and those runtimes register.

A registry below the layers that use it: the resource models validate ``mountPoint`` against it,
the UFS layer opens plugin schemes through it, and runtime plugins add theirs (a
ThinRuntimeProfile's ``fileSystemType``) without the core importing any plugin package.
"""

from __future__ import annotations

import re
from importlib.metadata import entry_points

from fsspec.registry import known_implementations as _fsspec_known
from fsspec.registry import registry as _fsspec_registry

# Schemes a Mount may not use although fsspec knows them: "datacache" would read a dataset
# through itself, and fsspec's caching wrappers would cache a cache.
_EXCLUDED_SCHEMES = frozenset({"datacache", "blockcache", "cached", "filecache", "simplecache"})
_EXTRA_SCHEMES: set[str] = {"file", "local"}
SCHEME_PATTERN = r"^[a-z][a-z0-9+.-]*$"
"""What a registered scheme must match (lowercase, as URL schemes are compared)."""
_SCHEME = re.compile(SCHEME_PATTERN)


def register_scheme(name: str) -> None:
    """Allow mounts with ``name://...`` (for runtime plugins that serve their own scheme).

    Raises ``ValueError`` if ``name`` is not a lowercase URL scheme (``[a-z][a-z0-9+.-]*``).
    """
    if not isinstance(name, str) or not _SCHEME.match(name):
        raise ValueError(f"{name!r} is not a valid scheme: use lowercase letters, digits, '+', '.', '-'")
    _EXTRA_SCHEMES.add(name)


def known_schemes() -> frozenset[str]:
    """Schemes a Mount may use: fsspec's known and registered ones, ``file``/``local`` and plugins'."""
    names = set(_fsspec_known) | set(_fsspec_registry)  # both are live views
    return frozenset((names - _EXCLUDED_SCHEMES) | _EXTRA_SCHEMES)


RUNTIME_PLUGIN_GROUP = "datacache.runtimes"
"""Entry-point group of runtime plugins (see ``runtimes/README.md``)."""


def plugin_schemes() -> frozenset[str]:
    """Names of the installed runtime plugins (entry points in :data:`RUNTIME_PLUGIN_GROUP`); a mount
    may use each as its URL scheme. Reads package metadata (about 10 ms), so it is consulted only
    for schemes fsspec does not know."""
    return frozenset(entry_points(group=RUNTIME_PLUGIN_GROUP).names)


def register_profile_schemes(profile_docs: list[dict]) -> None:
    """Let mounts use stored ThinRuntimeProfiles' ``fileSystemType`` as their URL scheme
    (``profile_docs``: the profiles' documents; a new process re-registers them)."""
    for doc in profile_docs:
        register_scheme(doc["spec"]["fileSystemType"])
