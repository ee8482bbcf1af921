"""Which directory entries the kernel may hold that a manifest change contradicts.

Used by the handlers (``kernel_ops``): after a ``datacache sync`` or a per-file refresh, these
``(parent, name)`` pairs are invalidated so the next lookup sees the new manifest (cases C3, C4,
C5).
"""

from __future__ import annotations

import functools
import posixpath


def stale_names(old, new) -> set[tuple[str, str]]:
    """``(parent dir, name)`` of every directory entry the kernel may hold under ``old`` that
    ``new`` contradicts: changed files (a new version is a new inode), the shallowest vanished
    component of deleted paths, and the shallowest new component of added paths (where a negative
    entry may sit)."""
    diff = old.diff(new)
    names = {posixpath.split(p) for p in diff.changed}
    for manifest, paths in ((new, diff.deleted), (old, diff.added)):
        is_dir = functools.lru_cache(maxsize=None)(manifest.is_dir)
        for path in paths:
            parent, parts = "", path.split("/")
            for part in parts[:-1]:
                here = f"{parent}/{part}" if parent else part
                if not is_dir(here):
                    break
                parent = here
            else:
                part = parts[-1]
            names.add((parent, part))
    return names
