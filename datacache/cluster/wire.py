"""What travels between clients and cache workers: block requests and errors, validated.

A block is named on the wire by the fields of its file version (``mount``, ``ufs_path``,
``version``, ``size``), its ``index``, and the ``dataset``/``block_size`` the client believes in.
The worker recomputes the BlockKey itself (:mod:`datacache.cache.blocks`) and checks every field
before touching its store or the UFS: the dataset must be its own, the block size its own, the
mount one of the dataset's, the UFS path normalized and inside the mount's root (no ``..``, no
escaping a ``file://`` mount), sizes and indexes integers in range. Anything else is a
:class:`BadRequest` (HTTP 400) naming the field.

Errors of a fill (the UFS's ``FileNotFoundError``, ``StaleFileError``, ``UFSUnavailableError``,
``OSError(ENOSPC)``) travel as ``{"error", "errno", "message"}`` with HTTP 502 and are raised again
on the client with the same type and errno, so a missing object stays ENOENT end to end.
"""

from __future__ import annotations

import errno as errnos
import posixpath

from datacache.cache.blocks import block_count
from datacache.errors import StaleFileError, UFSUnavailableError
from datacache.manifest import FileEntry

MAX_FILE_SIZE = 1 << 50
MAX_KEYS = 65536
MAX_TEXT = 4096
UFS_ERROR_STATUS = 502


class BadRequest(ValueError):
    """A request field is missing or invalid (HTTP 400); the message names the field."""


class WrongDataset(LookupError):
    """The request names another dataset than the worker's (HTTP 409)."""


def entry_fields(entry: FileEntry) -> dict:
    """The wire fields of a file version."""
    return {"mount": entry.mount, "ufs_path": entry.ufs_path, "version": entry.version, "size": entry.size}


def _text(fields: dict, name: str) -> str:
    value = fields.get(name)
    if not isinstance(value, str) or not value or len(value) > MAX_TEXT or "\0" in value:
        raise BadRequest(f"{name}: expected a non-empty string of at most {MAX_TEXT} characters")
    return value


def _int(fields: dict, name: str, low: int, high: int) -> int:
    value = fields.get(name)
    if isinstance(value, str) and value.isdigit() and len(value) < 20:
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise BadRequest(f"{name}: expected an integer in [{low}, {high}]")
    return value


def check_scope(fields: dict, dataset: str, block_size: int | None = None) -> None:
    """Raise WrongDataset unless the request names this worker's ``dataset``, and (when
    ``block_size`` is given) BadRequest unless it cuts blocks at the worker's block size."""
    if fields.get("dataset") != dataset:
        raise WrongDataset(f"this worker serves dataset {dataset!r} only")
    if block_size is not None and _int(fields, "block_size", 1, 1 << 40) != block_size:
        raise BadRequest(f"block_size: this worker cuts blocks at {block_size} bytes")


def parse_entry(fields: dict, roots: dict[str, str]) -> FileEntry:
    """A FileEntry from wire ``fields``; ``roots`` maps each mount name to its UFS root path.

    Raises BadRequest for an unknown mount or a UFS path outside the mount's root.
    """
    mount = _text(fields, "mount")
    if mount not in roots:
        raise BadRequest(f"mount: no mount {mount!r} in this dataset")
    ufs_path = _text(fields, "ufs_path")
    root = roots[mount]
    inside = (ufs_path == root or ufs_path.startswith(root.rstrip("/") + "/")) if root else True
    if posixpath.normpath(ufs_path) != ufs_path.rstrip("/") or ".." in ufs_path.split("/") or not inside:
        raise BadRequest("ufs_path: not a normalized path inside the mount's root")
    size = _int(fields, "size", 0, MAX_FILE_SIZE)
    return FileEntry(ufs_path, mount, ufs_path, size, 0.0, _text(fields, "version"))


def parse_index(fields: dict, entry: FileEntry, block_size: int, name: str = "index") -> int:
    """Block index ``fields[name]``, checked against the file's block count."""
    return _int(fields, name, 0, max(block_count(entry.size, block_size) - 1, 0))


def parse_seconds(fields: dict, name: str = "seconds", high: int = 86400) -> int:
    """A whole number of seconds in ``[1, high]`` in ``fields[name]``."""
    return _int(fields, name, 1, high)


def parse_worker_id(fields: dict, name: str) -> str:
    """A worker id (``worker-<i>``) in ``fields[name]``."""
    value = fields.get(name)
    if not isinstance(value, str) or not value.startswith("worker-") or not value[7:].isdigit() or len(value) > 20:
        raise BadRequest(f"{name}: expected a worker id like 'worker-0'")
    return value


def parse_key_list(body, limit: int = MAX_KEYS) -> list:
    """The ``keys`` list of a JSON body (strings), at most ``limit`` long."""
    keys = body.get("keys") if isinstance(body, dict) else None
    if not isinstance(keys, list) or len(keys) > limit or not all(isinstance(k, str) for k in keys):
        raise BadRequest(f"keys: expected a list of at most {limit} block keys")
    return keys


def error_body(err: OSError) -> dict:
    """The wire form of a UFS/store error."""
    return {"error": type(err).__name__, "errno": err.errno or errnos.EIO, "message": err.strerror or str(err)}


def raise_error(body: dict, path: str, where: str) -> None:
    """Raise the error ``body`` describes, for dataset path ``path``; ``where`` names the worker."""
    code = body.get("errno") if isinstance(body.get("errno"), int) else errnos.EIO
    message = f"{body.get('message', 'cache worker error')} (via {where})"
    if code == errnos.ENOENT:
        raise FileNotFoundError(code, message, path)
    err: OSError
    if code == errnos.ESTALE:
        err = StaleFileError(path, "")
    elif code == errnos.EIO:
        err = UFSUnavailableError(path, "")
    else:
        err = OSError(code, "", path)
    err.strerror = message
    raise err
