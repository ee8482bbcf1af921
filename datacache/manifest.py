"""Manifest: a dataset's namespace as a columnar snapshot.

One row per file: ``path`` (dataset path, relative, '/'-separated), ``mount``, ``ufs_path``,
``size`` (bytes), ``mtime`` (seconds), ``version`` (see ``ufs.versions``). Stored as Parquet so that
large namespaces load, list and diff fast; ``fileNum`` and ``ufsTotal`` come from it, never from a
walk at query time. A directory index (dir -> children) serves FUSE lookups and ``ls``.
Directories are implied by file paths, as in object stores.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
from dataclasses import dataclass
from typing import Iterable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from datacache.entry import FileEntry

__all__ = ["FileEntry", "Manifest", "ManifestDiff", "normalize"]

SCHEMA = pa.schema([
    ("path", pa.string()),
    ("mount", pa.string()),
    ("ufs_path", pa.string()),
    ("size", pa.int64()),
    ("mtime", pa.float64()),
    ("version", pa.string()),
])


@dataclass(frozen=True)
class ManifestDiff:
    """Dataset paths ``added``, ``changed`` (new version) and ``deleted`` between two manifests."""

    added: list[str]
    changed: list[str]
    deleted: list[str]

    @property
    def empty(self) -> bool:
        return not (self.added or self.changed or self.deleted)


def normalize(path: str) -> str:
    """A dataset path in canonical form: no leading/trailing '/', no '.' parts; '' is the root.

    Raises ``ValueError`` for '..' parts or NUL bytes, which could escape the namespace.
    """
    if "\0" in path:
        raise ValueError(f"invalid dataset path {path!r}: contains a NUL byte")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"invalid dataset path {path!r}: '..' is not allowed")
    return "/".join(parts)


class Manifest:
    """An immutable snapshot; build with :meth:`from_entries` or :meth:`load`."""

    def __init__(self, table: pa.Table):
        self.table = table.sort_by("path")
        cols = {name: self.table.column(name).to_pylist() for name in SCHEMA.names}
        self._rows = [FileEntry(*vals) for vals in zip(*(cols[n] for n in SCHEMA.names))]
        self._by_path = {e.path: e for e in self._rows}
        self._dirs: dict[str, dict[str, FileEntry | None]] = {"": {}}
        for e in self._rows:
            parent, name = posixpath.split(e.path)
            self._dirs.setdefault(parent, {})[name] = e
            while parent:  # register missing ancestors as subdirectories of their parents
                grand, dname = posixpath.split(parent)
                siblings = self._dirs.setdefault(grand, {})
                if dname in siblings:
                    break
                siblings[dname] = None
                parent = grand

    @classmethod
    def from_entries(cls, entries: Iterable) -> "Manifest":
        """From FileEntry objects (e.g. a UFS listing)."""
        cols: dict[str, list] = {n: [] for n in SCHEMA.names}
        for e in entries:
            for n in SCHEMA.names:
                cols[n].append(getattr(e, n))
        return cls(pa.table(cols, schema=SCHEMA))

    @classmethod
    def load(cls, path: str) -> "Manifest":
        return cls(pq.read_table(path, schema=SCHEMA))

    def save(self, path: str) -> None:
        """Write atomically (temp file + rename), mode 0600."""
        tmp = f"{path}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, "wb") as f:
            pq.write_table(self.table, f)
        os.replace(tmp, path)

    @property
    def file_num(self) -> int:
        return len(self._rows)

    @property
    def total_size(self) -> int:
        """Sum of file sizes in bytes (ufsTotal)."""
        return sum(e.size for e in self._rows)

    def lookup(self, path: str) -> FileEntry | None:
        """The file at dataset ``path`` (normalised), or None (also for directories)."""
        return self._by_path.get(normalize(path))

    def is_dir(self, path: str) -> bool:
        return normalize(path) in self._dirs

    def listdir(self, path: str) -> dict[str, FileEntry | None]:
        """Children of directory ``path``: name -> FileEntry, or None for a subdirectory.

        Raises FileNotFoundError / NotADirectoryError."""
        key = normalize(path)
        if key in self._dirs:
            return self._dirs[key]
        if key in self._by_path:
            raise NotADirectoryError(f"{path}: not a directory")
        raise FileNotFoundError(f"{path}: no such file or directory in the dataset")

    def __iter__(self) -> Iterator[FileEntry]:
        return iter(self._rows)

    def select(self, pattern: str) -> list[FileEntry]:
        """Files matching ``pattern``: a file, a directory (everything below it) or a glob
        (fnmatch, '*' also crosses '/'). An empty list when nothing matches."""
        key = normalize(pattern)
        if key in self._by_path:
            return [self._by_path[key]]
        if key in self._dirs:
            prefix = f"{key}/" if key else ""
            return [e for e in self._rows if e.path.startswith(prefix)]
        if any(c in key for c in "*?["):
            return [e for e in self._rows if fnmatch.fnmatchcase(e.path, key)]
        return []

    def diff(self, newer: "Manifest") -> ManifestDiff:
        """What changed from this snapshot to ``newer``."""
        old, new = self._by_path, newer._by_path
        return ManifestDiff(
            added=sorted(p for p in new if p not in old),
            changed=sorted(p for p in new if p in old and new[p].version != old[p].version),
            deleted=sorted(p for p in old if p not in new),
        )

    def with_entry(self, entry: FileEntry | None, path: str) -> "Manifest":
        """A copy with ``path`` replaced by ``entry`` (or removed when ``entry`` is None)."""
        rows = [e for e in self._rows if e.path != path]
        if entry is not None:
            rows.append(entry)
        return Manifest.from_entries(rows)
