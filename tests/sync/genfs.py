"""A generated source for sync tests: an fsspec filesystem whose files are computed, not stored.

``gensrc://data`` holds ``files`` files ``data/dNNNN/fNNNNNNN.bin`` (id i in directory
i // per_dir), of ``size_of(i)`` bytes, ETag ``etag_of(i, changed_mod)``. Files whose id is
``1 (mod deleted_mod)`` do not exist; files whose id is ``0 (mod changed_mod)`` have a second
version. ``reverse`` lists each directory in descending order, so that a listing is not sorted and
the sync's external merge sort has real work. The environment variable ``GENSRC_OVERRIDE`` (JSON)
overrides options, so that a test can change the source under a Dataset without changing its
spec. Register with :func:`register` (also in a child process) before a Dataset uses the scheme.

File contents are not served: the sync tests only list.
"""

from __future__ import annotations

import json
import os

import fsspec
from fsspec.spec import AbstractFileSystem

PROTOCOL = "gensrc"


def size_of(i: int) -> int:
    return i % 4096 + 1


def etag_of(i: int, changed_mod: int = 0) -> str:
    return f'"{i:x}-v2"' if changed_mod and i % changed_mod == 0 else f'"{i:x}"'


def exists(i: int, files: int, deleted_mod: int = 0) -> bool:
    return 0 <= i < files and not (deleted_mod and i % deleted_mod == 1)


def dataset_path(i: int, per_dir: int) -> str:
    return f"d{i // per_dir:04d}/f{i:07d}.bin"


class GeneratedFileSystem(AbstractFileSystem):
    """Read-only listing of generated files (see the module docstring for the options)."""

    protocol = PROTOCOL
    root_marker = ""
    cachable = False

    def __init__(self, files: int = 1000, per_dir: int = 1000, changed_mod: int = 0, deleted_mod: int = 0,
                 reverse: bool = False, **kwargs):
        super().__init__(**kwargs)
        override = json.loads(os.environ.get("GENSRC_OVERRIDE", "{}"))
        files, changed_mod, deleted_mod, reverse = (override.get(k, v) for k, v in (
            ("files", files), ("changed_mod", changed_mod), ("deleted_mod", deleted_mod), ("reverse", reverse)))
        self.files, self.per_dir = int(files), int(per_dir)
        self.changed_mod, self.deleted_mod, self.reverse = int(changed_mod), int(deleted_mod), bool(reverse)

    def _infos(self, d: int, ids) -> list[dict]:
        prefix = f"data/d{d:04d}/f"  # dataset_path(i, per_dir), built once per directory
        return [{"name": f"{prefix}{i:07d}.bin", "type": "file", "size": size_of(i),
                 "ETag": etag_of(i, self.changed_mod), "LastModified": 1_700_000_000.0 + i}
                for i in ids if exists(i, self.files, self.deleted_mod)]

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path).strip("/")
        dirs = -(-self.files // self.per_dir)
        if path == "data":
            out = [{"name": f"data/d{d:04d}", "type": "directory", "size": 0} for d in range(dirs)]
        elif path.startswith("data/d") and path[6:].isdigit() and int(path[6:]) < dirs:
            d = int(path[6:])
            ids = range(d * self.per_dir, min((d + 1) * self.per_dir, self.files))
            out = self._infos(d, reversed(ids) if self.reverse else ids)
        else:
            raise FileNotFoundError(path)
        return out if detail else [o["name"] for o in out]

    def info(self, path, **kwargs):
        path = self._strip_protocol(path).strip("/")
        if path == "data" or (path.startswith("data/d") and "/" not in path[5:]):
            self.ls(path)  # raises FileNotFoundError for a directory that is not there
            return {"name": path, "type": "directory", "size": 0}
        raise FileNotFoundError(path)


def register() -> None:
    fsspec.register_implementation(PROTOCOL, GeneratedFileSystem, clobber=True)
