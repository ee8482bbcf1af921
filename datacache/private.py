"""Private files and directories: everything datacache writes is 0700 (dirs) / 0600 (files), so a
second local user can read neither cached data nor state (case C10)."""

from __future__ import annotations

import os

DIR_MODE = 0o700
FILE_MODE = 0o600


def makedirs(path: str) -> str:
    """Create ``path`` and any missing parents with mode 0700 (``os.makedirs`` gives the mode to
    the leaf only); an existing leaf is tightened to 0700. Returns ``path``."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        makedirs(parent)
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        os.chmod(path, DIR_MODE)
    return path


def touch(path: str) -> str:
    """Create ``path`` (empty) with mode 0600 if missing; an existing file is tightened to 0600.

    An existing file is never opened: closing any descriptor of a file drops every ``fcntl`` lock
    this process holds on it, and SQLite keeps its locks that way (a second connection's
    ``touch`` would silently unlock the first, and another process could then delete the WAL)."""
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, FILE_MODE))
    except FileExistsError:
        pass
    os.chmod(path, FILE_MODE)
    return path
