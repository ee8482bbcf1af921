"""Metadata sync in bounded memory (case C12): a UFS listing in, a sorted manifest and a diff out.

The namespace is never held in Python objects, whatever the number of files:

1. The listing (streamed by ``UnionNamespace.list_files``) is gathered in batches of
   ``BATCH_ROWS`` entries; each batch is sorted by path (Arrow) and appended to the current *run*
   (a temporary Parquet file) when it starts after the run's last path, else it opens a new run.
   A listing already in order (S3 lists keys in order) makes one run, which becomes the manifest as
   it is; otherwise the runs are merged, ``MERGE_ROWS`` rows per run at a time, with Arrow's sort
   (``manifest.aligned_batches``): an external merge sort that takes advantage of natural runs
   (Knuth, TAOCP vol. 3, 5.4.1).
2. The diff is a merge join of the old and the new manifest's (path, version) columns read batch
   by batch (``manifest.diff_batches``); every change goes to ``diff.parquet`` beside the manifest
   and the returned ManifestDiff keeps the counts and the first ``DIFF_LIMIT`` paths of each kind.
3. A file whose path is also a directory (object keys ``x`` and ``x/y``, or ``x`` and a directory
   marker ``x/``) is left out: a directory and a file cannot share a name, and the directory wins,
   as in Mountpoint for Amazon S3 (its doc/SEMANTICS.md: "Files will be shadowed by directories
   with the same name"). A directory row (an empty directory or a marker, path ending in '/', see
   :mod:`datacache.manifest`) with anything listed below it is left out too: the directory is
   implied by its contents. Two passes over the path column find them; the file is rewritten
   only when there are some.
4. The new manifest replaces the old one atomically (rename), once the diff is written.

Memory: O(BATCH_ROWS + MERGE_FANIN × MERGE_ROWS) rows (more runs are merged in passes), plus the set
of directory paths while looking for shadowed files. When two mounts map files to the same dataset
path, the later mount's file wins.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import shutil
import tempfile
from typing import Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from datacache.entry import FileEntry, SkippedLink
from datacache.manifest import (BATCH_ROWS, DIFF_LIMIT, DIR, SCHEMA, ManifestDiff, aligned_batches, diff_batches,
                                entries_table)
from datacache.stack import syncmark

__all__ = ["sync_manifest", "DIFF_FILE"]

DIFF_FILE = "diff.parquet"
MERGE_ROWS = 4096  # rows read at a time from each run while merging
MERGE_FANIN = 16  # runs merged at once
LIST_CHUNK = 8192  # files turned from Python objects into Arrow at a time; progress is reported after each

Progress = Callable[[int], None]
"""``on_progress(files_listed)``: called after every chunk of (up to) LIST_CHUNK files."""


def sync_manifest(files: Iterable[FileEntry | SkippedLink], manifest_path: str, on_progress: Progress | None = None,
                  batch_rows: int = BATCH_ROWS) -> ManifestDiff:
    """Write the manifest of ``files`` (any order) to ``manifest_path`` (Parquet, sorted by path,
    mode 0600, replaced atomically) and return the diff from the manifest stored there before (an
    empty one counts as nothing: every file is added). The full diff is written to ``diff.parquet``
    in the same directory (``ManifestDiff.file``), replaced by the next sync. Files shadowed by a
    directory of the same path are left out and counted (``ManifestDiff.shadowed``), and so are
    files dropped for a later one with the same dataset path (``ManifestDiff.duplicates``) and
    the symbolic links the listing skipped (``ManifestDiff.links``).

    Errors of the listing (``ResourceError`` from ``list_files``) propagate and leave the stored
    manifest as it was. Temporary files live in a 0700 directory beside the manifest.
    """
    directory = os.path.dirname(os.path.abspath(manifest_path))
    work = tempfile.mkdtemp(prefix=".sync-", dir=directory)
    try:
        new_path = os.path.join(work, "manifest.parquet")
        dropped, links = _Noted(), _Noted()
        runs = _write_runs(files, work, on_progress, batch_rows, dropped, links)
        while len(runs) > MERGE_FANIN:  # merge in passes, so memory stays one row group per open run
            runs = [_merge_runs(runs[i:i + MERGE_FANIN], os.path.join(work, f"merged-{len(runs)}-{i}.parquet"),
                                MERGE_ROWS, dropped) for i in range(0, len(runs), MERGE_FANIN)]
        if len(runs) == 1:
            os.replace(runs[0], new_path)
        else:
            _merge_runs(runs, new_path, batch_rows, dropped)
        shadowed, shadowed_paths = _drop_shadowed(new_path, work, batch_rows)
        os.chmod(new_path, 0o600)  # after _drop_shadowed, which may write it anew
        with syncmark.manifest_write(directory):  # the diff is against the manifest it replaces
            old = _path_versions(manifest_path) if os.path.exists(manifest_path) else iter(())
            diff = diff_batches(old, _path_versions(new_path), out=os.path.join(work, DIFF_FILE))
            os.replace(new_path, manifest_path)
        # Written in the private work directory first: two syncs at once never share a file.
        diff = dataclasses.replace(diff, file=os.path.join(directory, DIFF_FILE), shadowed=shadowed,
                                   shadowed_paths=shadowed_paths, duplicates=dropped.count,
                                   duplicate_paths=tuple(sorted(set(dropped.paths))), links=links.count,
                                   link_paths=tuple(sorted(links.paths)))
        os.replace(os.path.join(work, DIFF_FILE), diff.file)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        # Give the sort buffers back to the OS now: Arrow's allocator keeps freed pages for reuse,
        # which would add them to whatever the process loads next (the manifest, for status).
        pa.default_memory_pool().release_unused()
    return diff


def _read(path: str, rows: int, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    """Batches of ``rows`` rows of a Parquet file, read one row group at a time on this thread
    (no pre-buffering of the whole file, no per-thread allocator arenas: measured 50 MiB less
    with 16 runs open)."""
    yield from pq.ParquetFile(path, pre_buffer=False).iter_batches(batch_size=rows, columns=columns,
                                                                   use_threads=False)


def _drop_shadowed(path: str, work: str, batch_rows: int) -> tuple[int, tuple[str, ...]]:
    """Leave out of the sorted manifest file ``path`` every file whose path is also a directory,
    and every directory row with something below it (step 3 of the module's docstring). Returns
    ``(how many files, the first DIFF_LIMIT of them)``."""
    parents: set[str] = set()  # directories with something listed below them
    doomed: set[str] = set()  # paths to leave out: files named as a directory row ('x' for 'x/'), ...
    for batch in _read(path, batch_rows, ["path"]):
        paths = batch.column(0)
        dir_rows = pc.ends_with(paths, DIR)
        doomed.update(pc.utf8_slice_codeunits(pc.filter(paths, dir_rows), 0, -1).to_pylist())
        paths = pc.if_else(dir_rows, pc.utf8_slice_codeunits(paths, 0, -1), paths)  # 'd/' is below 'd' as 'd/x' is
        nested = pc.filter(paths, pc.match_substring(paths, "/"))
        for parent in pc.unique(pc.replace_substring_regex(nested, pattern="/[^/]*$", replacement="")).to_pylist():
            while parent and parent not in parents:  # a directory's ancestors are directories too
                parents.add(parent)
                parent = parent.rpartition("/")[0]
    # ... and files named as a directory with something below it ('x' for 'x/y'), and its row ('x/')
    doomed |= parents
    doomed.update(p + DIR for p in parents)
    if not doomed:
        return 0, ()
    value_set = pa.array(sorted(doomed), SCHEMA.field("path").type)
    found: list[str] = []
    count = rows_left_out = 0
    for batch in _read(path, batch_rows, ["path"]):
        hit = pc.filter(batch.column(0), pc.is_in(batch.column(0), value_set=value_set))
        rows_left_out += len(hit)
        files = pc.filter(hit, pc.invert(pc.ends_with(hit, DIR)))
        count += len(files)
        found.extend(files.to_pylist()[:DIFF_LIMIT - len(found)])
    if rows_left_out:
        kept = os.path.join(work, "unshadowed.parquet")
        with pq.ParquetWriter(kept, SCHEMA) as writer:
            for batch in _read(path, batch_rows):
                keep = pc.invert(pc.is_in(batch.column("path"), value_set=value_set))
                writer.write_table(pa.Table.from_batches([batch]).filter(keep), row_group_size=batch_rows)
        os.replace(kept, path)
    return count, tuple(found)


def _path_versions(path: str) -> Iterator[pa.RecordBatch]:
    return _read(path, BATCH_ROWS, ["path", "version"])


class _Noted:
    """Paths of the listing left out for one reason (files dropped because a later one has the
    same dataset path, object keys like ``a//b`` and ``a/b``; symbolic links): how many, and the
    first DIFF_LIMIT."""

    def __init__(self):
        self.count, self.paths = 0, []

    def note(self, paths: pa.Array | list[str]) -> None:
        self.count += len(paths)
        kept = paths[:max(DIFF_LIMIT - len(self.paths), 0)]
        self.paths.extend(kept if isinstance(kept, list) else kept.to_pylist())


def _sorted_unique(table: pa.Table, dropped: _Noted) -> pa.Table:
    """``table`` sorted by path; of equal paths the last one is kept (sort_by is stable), the
    others noted in ``dropped``."""
    table = table.sort_by("path")
    paths = table.column("path")
    if len(paths) > 1:
        keep = pc.not_equal(paths[:-1], paths[1:])
        if not pc.all(keep).as_py():
            twins = pc.filter(paths[:-1], pc.invert(keep)).combine_chunks()
            dropped.note(pc.filter(twins, pc.invert(pc.ends_with(twins, DIR))))  # a directory twice is no loss
            table = table.filter(pa.concat_arrays([keep.combine_chunks(), pa.array([True])]))
    return table


class _Runs:
    """Sorted runs as Parquet files in ``work``: a sorted table extends the current run when it
    starts after the run's last path, else it opens a new run."""

    def __init__(self, work: str):
        self.work, self.paths = work, []
        self._writer, self._last = None, None

    def add(self, table: pa.Table) -> None:
        paths = table.column("path")
        if self._writer is None or (len(paths) and paths[0].as_py() <= self._last):
            self.close()
            self.paths.append(os.path.join(self.work, f"run-{len(self.paths)}.parquet"))
            self._writer = pq.ParquetWriter(self.paths[-1], SCHEMA)
        if len(paths):  # small row groups: the merge reads one at a time from every run
            self._writer.write_table(table, row_group_size=MERGE_ROWS)
            self._last = paths[-1].as_py()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def _write_runs(files: Iterable[FileEntry | SkippedLink], work: str, on_progress: Progress | None,
                batch_rows: int, dropped: _Noted, links: _Noted) -> list[str]:
    """Sorted runs of ``files`` as Parquet files in ``work``; at least one (maybe empty); skipped
    links are noted in ``links``. Python objects exist for LIST_CHUNK files at a time; batches
    wait in Arrow until ``batch_rows``."""
    runs = _Runs(work)
    it = iter(files)
    pending: list[pa.Table] = []
    rows = listed = 0
    while chunk := list(itertools.islice(it, LIST_CHUNK)):
        if skipped := [e.path for e in chunk if isinstance(e, SkippedLink)]:
            links.note(skipped)
            chunk = [e for e in chunk if not isinstance(e, SkippedLink)]
        table = entries_table(chunk)
        pending.append(table)
        rows += len(chunk)
        listed += len(chunk) - pc.sum(pc.ends_with(table.column("path"), DIR)).as_py()  # files, not directories
        if on_progress is not None:
            on_progress(listed)
        if rows >= batch_rows:
            runs.add(_sorted_unique(pa.concat_tables(pending), dropped))
            pending, rows = [], 0
    if pending or not runs.paths:
        runs.add(_sorted_unique(pa.concat_tables(pending) if pending else entries_table([]), dropped))
    runs.close()
    return runs.paths


def _merge_runs(runs: list[str], out: str, batch_rows: int, dropped: _Noted) -> str:
    """K-way merge of sorted runs into one sorted Parquet file ``out`` (row groups of
    ``batch_rows``), unique paths; returns ``out``. Each step of
    ``aligned_batches`` is a slice of every run below a common frontier, so concatenating the slices
    (in run order) and sorting them (Arrow, stable) gives the next rows of the output."""
    streams = [_read(p, MERGE_ROWS) for p in runs]
    with pq.ParquetWriter(out, SCHEMA) as writer:
        pending: list[pa.Table] = []
        rows = 0
        for step in aligned_batches(streams):
            merged = _sorted_unique(pa.concat_tables([t for t in step if t is not None and t.num_rows]), dropped)
            pending.append(merged)
            rows += merged.num_rows
            if rows >= batch_rows:
                writer.write_table(pa.concat_tables(pending), row_group_size=batch_rows)
                pending, rows = [], 0
        if pending:
            writer.write_table(pa.concat_tables(pending), row_group_size=batch_rows)
    return out
