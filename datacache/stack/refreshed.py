"""Paths changed by per-file refreshes since the last metadata sync, for OnEvent DataLoads.

A reader that meets a file changed in the UFS (case C5: ESTALE) refreshes that one manifest entry
and stores the new manifest, so the next ``datacache sync`` finds nothing changed and the OnEvent
DataLoads watching the file would never run. So a refresh also appends the path to
``refreshed.jsonl`` in the dataset's directory (one JSON string per line: names may hold newlines,
case C7), under the manifest write lock like its save, and a sync adds the paths it takes from there
to the ones it found changed when it fires OnEvent DataLoads.
"""

from __future__ import annotations

import json
import os

from datacache import private

FILE = "refreshed.jsonl"


def record(directory: str, path: str) -> None:
    """Append dataset ``path`` to the refreshed paths of the dataset stored under ``directory``.
    Raises ``OSError`` when the file cannot be written."""
    fd = os.open(os.path.join(directory, FILE), os.O_WRONLY | os.O_CREAT | os.O_APPEND, private.FILE_MODE)
    with open(fd, "a", encoding="utf-8") as f:
        f.write(json.dumps(path) + "\n")


def take(directory: str) -> list[str]:
    """The refreshed paths recorded under ``directory`` (sorted, each once), removing the record;
    ``[]`` when there is none. Call it under the manifest write lock (``syncmark.manifest_write``)."""
    name = os.path.join(directory, FILE)
    try:
        with open(name, encoding="utf-8") as f:
            paths = {json.loads(line) for line in f if line.strip()}
    except FileNotFoundError:
        return []
    os.unlink(name)
    return sorted(paths)
