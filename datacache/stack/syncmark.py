"""Marks of a Dataset's metadata sync beside its manifest, visible to every process.

- ``sync.lock``: held (``flock``, exclusive) for as long as a sync runs, so any process computing
  status sees phase ``Updating``; a crashed sync releases it with its process, so a stale mark
  never says Updating forever. Two syncs of one dataset run one after the other.
- ``manifest.lock``: held (``flock``, exclusive) briefly by whoever replaces the stored manifest:
  a sync while it diffs and replaces it, a per-file refresh while it loads, edits and saves it,
  so neither overwrites the other's newer manifest with an older base.
- ``sync-failed``: the one-line reason of the last sync when it failed (0600), removed by the next
  sync that succeeds; status shows phase ``Failed`` with it while the old manifest stays in use.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from typing import Iterator

from datacache import private

LOCK_FILE = "sync.lock"
MANIFEST_LOCK_FILE = "manifest.lock"
FAILED_FILE = "sync-failed"


@contextlib.contextmanager
def _flocked(path: str) -> Iterator[None]:
    fd = os.open(private.touch(path), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def running(directory: str):
    """Hold the sync mark of the dataset directory ``directory`` (waits for another sync of it)."""
    return _flocked(os.path.join(directory, LOCK_FILE))


def manifest_write(directory: str):
    """Hold the manifest write lock of ``directory`` (waits while another process holds it)."""
    return _flocked(os.path.join(directory, MANIFEST_LOCK_FILE))


def is_running(directory: str) -> bool:
    """Whether some process (this one included) holds the sync mark of ``directory`` now."""
    try:
        fd = os.open(os.path.join(directory, LOCK_FILE), os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def record_failure(directory: str, reason: str) -> None:
    """Keep ``reason`` (one line) as why the last sync of ``directory`` failed."""
    path = private.touch(os.path.join(directory, FAILED_FILE + ".tmp"))
    with open(path, "w") as f:
        f.write(" ".join(reason.split()))
    os.replace(path, os.path.join(directory, FAILED_FILE))


def clear_failure(directory: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(directory, FAILED_FILE))


def last_failure(directory: str) -> str:
    """Why the last sync of ``directory`` failed, or '' when it did not (or none ran)."""
    try:
        with open(os.path.join(directory, FAILED_FILE)) as f:
            return f.read()
    except FileNotFoundError:
        return ""
