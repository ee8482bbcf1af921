"""Access traces: which files a run read, in the order of their first read, with their sizes.

A trace is ``<dataset dir>/traces/<RUN>.trace`` (mode 0600): one JSON line ``[path, bytes]``
per file, appended when a process of the run first reads the file (``O_APPEND``: the lines of
the DataLoader worker processes of one run interleave whole). A file read by two processes
appears twice; :func:`read_trace` keeps its first line. ``bytes`` is the size of the version
read, what a warmup of that file loads.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time

from datacache import private
from datacache.errors import ResourceError
from datacache.manifest import FileEntry

_RUN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def trace_dir(dataset_dir: str) -> str:
    return os.path.join(dataset_dir, "traces")


def run_name(run: str | None) -> str:
    """``run``, checked (letters, digits, '.', '_', '-'; raises ResourceError), or a new name
    from the time (``run-YYYYmmdd-HHMMSS``) for None or ''."""
    if not run:
        return time.strftime("run-%Y%m%d-%H%M%S")
    if not _RUN.match(run):
        raise ResourceError(f"trace run name {run!r}: use letters, digits, '.', '_' and '-' (up to 100)")
    return run


class TraceRecorder:
    """Appends the first read of each file in this process to run ``run``'s trace. Call it
    with a FileEntry (a DatasetClient read listener)."""

    def __init__(self, dataset_dir: str, run: str | None):
        self.run = run_name(run)
        self.path = os.path.join(private.makedirs(trace_dir(dataset_dir)), f"{self.run}.trace")
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, private.FILE_MODE)
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, entry: FileEntry) -> None:
        if entry.path in self._seen:
            return
        with self._lock:
            if entry.path in self._seen or self._fd < 0:
                return
            self._seen.add(entry.path)
            os.write(self._fd, (json.dumps([entry.path, entry.size]) + "\n").encode())

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def runs(dataset_dir: str) -> list[str]:
    """The dataset's recorded runs, oldest first (by the time their trace last grew)."""
    directory = trace_dir(dataset_dir)
    try:
        names = [n for n in os.listdir(directory) if n.endswith(".trace")]
    except FileNotFoundError:
        return []
    names.sort(key=lambda n: os.stat(os.path.join(directory, n)).st_mtime_ns)
    return [n[:-len(".trace")] for n in names]


def read_trace(dataset_dir: str, dataset: str, run: str | None = None) -> tuple[str, list[tuple[str, int]]]:
    """``(run, [(path, bytes), ...])`` in first-read order, each path once; ``run`` None: the
    last recorded. Raises ResourceError when there is no such trace (naming the runs there are)."""
    known = runs(dataset_dir)
    if run is None:
        if not known:
            raise ResourceError(f"dataset {dataset!r} has no recorded trace: record one with "
                                f"'datacache mount --record' or datacache:// with record=RUN")
        run = known[-1]
    if run not in known:
        raise ResourceError(f"dataset {dataset!r} has no trace {run!r} (recorded: {', '.join(known) or 'none'})")
    seen, out = set(), []
    with open(os.path.join(trace_dir(dataset_dir), f"{run}.trace")) as f:
        for line in f:
            try:
                path, size = json.loads(line)
            except ValueError:  # a line cut by a crash: the rest stands
                continue
            if path not in seen:
                seen.add(path)
                out.append((path, int(size)))
    return run, out
