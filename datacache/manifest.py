"""Manifest: a dataset's namespace as a columnar snapshot.

One row per file: ``path`` (dataset path, relative, '/'-separated), ``mount``, ``ufs_path``,
``size`` (bytes), ``mtime`` (seconds), ``version`` (see ``ufs.versions``). Stored as Parquet so that
large namespaces load, list and diff fast; ``fileNum`` and ``ufsTotal`` come from it, never from a
walk at query time. Directories are implied by file paths, as in object stores; a directory with
no file below it (an empty directory of a POSIX source, an S3/GCS directory marker ``valid/`` with
no key under it) is a row of its own whose ``path`` ends in '/' (size 0, version ''). Such rows
sort among the files (so the external sort and the streaming diff handle them as any row), are
kept apart from the files when a manifest loads (``table`` holds files only: ``fileNum`` and
``ufsTotal`` count files), and are only kept while nothing is listed below them (the sync drops
the others, see :mod:`datacache.control.sync`).

Rows are kept sorted by ``path`` (Arrow's byte order, which is also Python's ``str`` order and
S3's listing order), and stay in Arrow buffers: a million files cost their Parquet bytes decoded
(~100 MiB) instead of ~2 GiB of Python objects. Lookups are binary searches over the sorted path
column; a directory's children are the contiguous range of paths under ``dir/``, walked by jumping
over each subdirectory's range (also a binary search), so ``listdir`` costs O(children · log n).
Listings are kept in a small LRU cache (FUSE asks for the same directory repeatedly). A manifest of
up to 16,384 files is decoded into a dict once a process has searched a sixteenth of it (a reader
opens the rest); one of 100,000 rows and more is mapped from an Arrow copy beside its file
(:mod:`datacache.manifest_copy`) rather than decoded in every reading process.

A diff between two snapshots is a merge of their sorted (path, version) streams
(:func:`diff_batches`), so two manifests of any size diff in bounded memory. A directory row
appears in a diff (as ``valid/``) only when the directory itself appeared or vanished: an empty
directory that got a file, or lost its last one, is told by the file alone.
"""

from __future__ import annotations

import bisect
import errno
import fnmatch
import operator
import os
import random
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from xxhash import xxh3_64_intdigest

from datacache.entry import FileEntry
from datacache.manifest_copy import INDEX_SCHEMA, digest, read_copy, remove_copy, write_copy
from datacache.private import FILE_MODE

__all__ = ["FileEntry", "Manifest", "ManifestDiff", "normalize", "diff_batches", "aligned_batches",
           "entries_table", "SCHEMA", "BATCH_ROWS"]

SCHEMA = pa.schema([
    ("path", pa.string()),
    ("mount", pa.string()),
    ("ufs_path", pa.string()),
    ("size", pa.int64()),
    ("mtime", pa.float64()),
    ("version", pa.string()),
])
_ROW = operator.attrgetter(*SCHEMA.names)  # an entry as a tuple in SCHEMA's column order
DIR = "/"  # a row whose path ends so is a directory with nothing listed below it
DIFF_SCHEMA = pa.schema([("change", pa.string()), ("path", pa.string())])
CHANGES = ("added", "changed", "deleted")
BATCH_ROWS = 65536  # rows per Parquet row group and per batch held while streaming
DIFF_LIMIT = 10000  # paths of each kind a ManifestDiff keeps in memory when its full list is on disk
_DIR_CACHE_ENTRIES = 262144  # children held by the listdir LRU cache, all directories together
MAPPED_ROWS = 100_000  # manifests of this many rows and more get a mapped copy (see Manifest.load)
MAPPED_SUFFIX = ".arrow"
_FEW_ROWS = 2  # ranges of rows up to this long are read element by element (see Manifest.rows)
_FOUND_ENTRIES = 16384  # recent lookups kept (~5 MiB): a warm epoch's hits skip the binary search
_WHOLE_AFTER = 16  # a manifest of up to _FOUND_ENTRIES files is decoded whole after file_num / this searches
_INDEX_AFTER = 32  # a larger one gets its path index (_PathIndex) after file_num / this searches


@dataclass(frozen=True)
class ManifestDiff:
    """Dataset paths ``added``, ``changed`` (new version) and ``deleted`` between two manifests,
    each sorted; a path ending in '/' is a directory with nothing below it that appeared or
    vanished (see :func:`diff_batches`).

    A diff made by a metadata sync keeps at most ``DIFF_LIMIT`` paths of each kind in memory; then
    ``counts`` gives the true numbers ``(added, changed, deleted)`` and ``file`` the Parquet file
    (columns ``change``, ``path``) holding every path: use :meth:`paths` to read a kind whole.
    ``shadowed``: files of the listing left out of the new manifest because a directory has the
    same path (see :func:`datacache.control.sync.sync_manifest`); ``shadowed_paths``: the first
    ``DIFF_LIMIT`` of them. ``duplicates``: files of the listing dropped because a later one has the
    same dataset path (object keys that normalise alike: ``a//b`` and ``a/b``);
    ``duplicate_paths``: those paths (the first ``DIFF_LIMIT`` dropped). ``links``: symbolic links
    of POSIX sources the listing skipped (not followed); ``link_paths``: the first ``DIFF_LIMIT``
    of them. ``refreshed``: paths readers found changed and refreshed since the last
    sync (:mod:`datacache.stack.refreshed`), so this diff no longer counts them as changed.
    """

    added: list[str]
    changed: list[str]
    deleted: list[str]
    counts: tuple[int, int, int] | None = None
    file: str | None = field(default=None, compare=False)
    shadowed: int = 0
    shadowed_paths: tuple[str, ...] = ()
    duplicates: int = 0
    duplicate_paths: tuple[str, ...] = ()
    links: int = 0
    link_paths: tuple[str, ...] = ()
    refreshed: tuple[str, ...] = ()

    def __post_init__(self):
        if self.counts is None:
            object.__setattr__(self, "counts", (len(self.added), len(self.changed), len(self.deleted)))

    @property
    def empty(self) -> bool:
        return not any(self.counts)

    @property
    def truncated(self) -> bool:
        """True when some kind holds more paths than its in-memory list."""
        return self.counts != (len(self.added), len(self.changed), len(self.deleted))

    def paths(self, change: str) -> Iterator[str]:
        """Every path of one kind (``added``, ``changed`` or ``deleted``), sorted, streamed from
        ``file`` when the in-memory list is truncated. Raises ValueError for another kind."""
        if change not in CHANGES:
            raise ValueError(f"unknown change {change!r} (known: {', '.join(CHANGES)})")
        if not self.truncated or self.file is None:
            yield from getattr(self, change)
            return
        for batch in pq.ParquetFile(self.file).iter_batches(batch_size=BATCH_ROWS):
            kinds, paths = batch.column(0).to_pylist(), batch.column(1).to_pylist()
            yield from (p for k, p in zip(kinds, paths) if k == change)


def normalize(path: str) -> str:
    """A dataset path in canonical form: no leading/trailing '/', no '.' parts; '' is the root.

    Raises ``ValueError`` for '..' parts or NUL bytes, which could escape the namespace.
    """
    # Already canonical (every path the manifest hands out): no empty part (a leading, trailing or
    # double '/'), and no part starting with '.' ('.' and '..' among them): ~0.3 µs, not ~1.6 µs.
    if path and path[0] not in "/." and path[-1] != "/" and "//" not in path and "/." not in path \
            and "\0" not in path:
        return path
    if "\0" in path:
        raise ValueError(f"invalid dataset path {path!r}: contains a NUL byte")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"invalid dataset path {path!r}: '..' is not allowed")
    return "/".join(parts)


def _after_prefix(prefix: str) -> str:
    """The smallest string greater than every string starting with ``prefix`` ('' for none):
    the prefix with its last character incremented (for 'dir/' that is 'dir0')."""
    while prefix and prefix[-1] == "\U0010ffff":
        prefix = prefix[:-1]
    return prefix[:-1] + chr(ord(prefix[-1]) + 1) if prefix else ""


def _is_sorted(column: pa.ChunkedArray) -> bool:
    """Whether ``column`` is in non-decreasing order (vectorised, no Python objects per row)."""
    prev = None
    for chunk in column.chunks:
        if len(chunk) == 0:
            continue
        if len(chunk) > 1 and not pc.all(pc.less_equal(chunk[:-1], chunk[1:])).as_py():
            return False
        if prev is not None and prev > chunk[0].as_py():
            return False
        prev = chunk[-1].as_py()
    return True


def _first_at_least(array: pa.Array, key: str) -> int:
    """Index of the first element of the sorted string ``array`` that is >= ``key`` (its length
    if none): Arrow's ``search_sorted`` (byte order, which is ``str`` order for UTF-8), ~4 µs in
    a batch of 65,536 paths against ~10-16 µs for ``bisect`` over Python strings (2026-12-06).
    A ``key`` with surrogates (a name FUSE decoded from bytes that are not UTF-8) sorts by its
    ``surrogatepass`` bytes, which is ``str`` order too: it matches no stored path."""
    try:
        return pc.search_sorted(array, pa.scalar(key, array.type)).as_py()
    except UnicodeEncodeError:
        raw = pa.large_binary() if pa.types.is_large_string(array.type) else pa.binary()
        return pc.search_sorted(array.view(raw), pa.scalar(key.encode("utf-8", "surrogatepass"), raw)).as_py()


def _values(array: pa.Array) -> Callable[[int], object]:
    """``i -> array[i].as_py()`` for a string, int64 or float64 ``array`` without nulls, read from
    its buffers through memoryviews (~0.1-0.4 us a value against ~0.5-1 us, 2026-12-06); other
    arrays through ``as_py``."""
    kind, n, start, buffers = array.type, len(array), array.offset, array.buffers()
    if array.null_count == 0 and kind == pa.string():
        offsets = _view(buffers[1], "i", start + n + 1)[start:]
        data = memoryview(buffers[2] if buffers[2] is not None else b"")
        return lambda i: str(data[offsets[i]:offsets[i + 1]], "utf-8")
    if array.null_count == 0 and kind in (pa.int64(), pa.float64()):
        return _view(buffers[1], "q" if kind == pa.int64() else "d", start + n)[start:].__getitem__
    return lambda i: array[i].as_py()


def _view(buffer: pa.Buffer | None, fmt: str, count: int) -> memoryview:
    """The first ``count`` items of format ``fmt`` (``struct``'s, native order: Arrow's) of ``buffer``."""
    data = memoryview(buffer if buffer is not None else b"").cast("B")
    return data[:count * struct.calcsize(fmt)].cast(fmt)


class _PathIndex:
    """Every file path's xxh3-64, sorted, with its row: an exact look-up is a hash, a ``bisect``
    over the hashes and one path comparison per row of that hash, ~1.2-1.9 us at 100,000 files
    against ~5-8 us for Arrow's ``search_sorted`` over the paths (a scalar built and a compute
    kernel called each time); with the entry decoded, ~6 us against 9-16 us. Built from ``chunks``
    (the path arrays in row order) in ~0.25 us a file (hashing, Arrow's sort; 100,000 files: 26-41
    ms), 12 bytes a file: a process builds it once it has searched enough
    (:data:`_INDEX_AFTER`), as a DataLoader worker over ImageNet's 1.28 million files does in its
    first epoch (2026-12-06); a mapped copy holds the index built by its writer
    (:meth:`Manifest.load`). ``batch``: its hashes and rows (:data:`INDEX_SCHEMA`), whose views
    (no copy) the look-ups search."""

    def __init__(self, batch: pa.RecordBatch):
        self.batch = batch
        n = batch.num_rows
        self._hashes = _view(batch.column(0).buffers()[1], "Q", n)
        self._rows = _view(batch.column(1).buffers()[1], "I", n)

    @classmethod
    def build(cls, chunks: list[pa.Array]) -> "_PathIndex":
        """The index of the path arrays ``chunks`` (in row order)."""
        return cls.of_hashes([_path_hashes(c) for c in chunks])

    @classmethod
    def of_hashes(cls, hashes: list[pa.Array]) -> "_PathIndex":
        """The index of the paths whose :func:`_path_hashes` are ``hashes`` (in row order)."""
        whole = pa.concat_arrays(hashes) if hashes else pa.array([], pa.uint64())
        order = pc.sort_indices(whole)
        return cls(pa.record_batch([whole.take(order), order.cast(pa.uint32())], schema=INDEX_SCHEMA))

    def find(self, key: str, path_at: Callable[[int], str]) -> int | None:
        """The row whose path (``path_at(row)``) is ``key``, or None."""
        # surrogatepass: a name FUSE decoded from bytes that are not UTF-8 hashes, and matches no path
        hashes, h = self._hashes, xxh3_64_intdigest(key.encode("utf-8", "surrogatepass"))
        i = bisect.bisect_left(hashes, h)
        while i < len(hashes) and hashes[i] == h:  # more than one only for paths whose hashes collide
            if path_at(self._rows[i]) == key:
                return self._rows[i]
            i += 1
        return None


def _path_hashes(paths: pa.Array) -> pa.Array:
    """The xxh3-64 of each of ``paths`` (uint64), :data:`BATCH_ROWS` at a time (a chunk may hold
    every row: a million paths as ``str`` at once took ~200 MiB)."""
    parts = [paths.slice(start, BATCH_ROWS).to_pylist() for start in range(0, len(paths), BATCH_ROWS)]
    return pa.concat_arrays([pa.array([xxh3_64_intdigest(p.encode()) for p in part], pa.uint64()) for part in parts]
                            or [pa.array([], pa.uint64())])


class _CopyRows:
    """The rows of a manifest file (``parquet``, sorted by path, SCHEMA) as its mapped copy holds
    them, read :data:`BATCH_ROWS` rows at a time (never the whole table: a million rows decoded
    are ~160 MiB): the file rows, then the directory rows (few). Once every batch is read,
    :meth:`tail` gives the number of file rows and their path index. Iterating raises
    ValueError when the paths are not sorted (an older writer's file: decoded and sorted whole)."""

    def __init__(self, parquet: pq.ParquetFile):
        self._parquet = parquet
        self._files, self._hashes, self._dirs = 0, [], []

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        last = None
        for batch in self._parquet.iter_batches(BATCH_ROWS):
            paths = batch.column("path")
            if not len(paths):
                continue
            if paths.null_count:  # not a path: the whole decode keeps such a row as it is
                raise ValueError("the manifest has rows without a path")
            if not _is_sorted(pa.chunked_array([paths])) or (last is not None and last > paths[0].as_py()):
                raise ValueError("the manifest's paths are not sorted")
            last = paths[-1].as_py()
            is_dir = pc.ends_with(paths, DIR)
            files = batch.filter(pc.invert(is_dir))
            self._dirs.append(batch.filter(is_dir))
            self._hashes.append(_path_hashes(files.column("path")))
            self._files += files.num_rows
            yield files
        yield from (d for d in self._dirs if d.num_rows)

    def tail(self) -> tuple[int, pa.RecordBatch]:
        """``(file rows, path index)`` (:data:`INDEX_SCHEMA`), once the iteration has ended."""
        return self._files, _PathIndex.of_hashes(self._hashes).batch


class _Strings:
    """A string Arrow array as a read-only sequence of ``str`` for ``bisect``."""

    def __init__(self, array: pa.Array):
        self.array = array

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, i: int) -> str:
        return self.array[i].as_py()


def _entries(table: pa.Table) -> Iterator[FileEntry]:
    for batch in table.to_batches(max_chunksize=BATCH_ROWS):
        cols = [batch.column(n).to_pylist() for n in SCHEMA.names]
        yield from (FileEntry(*row) for row in zip(*cols))


def entries_table(entries: Iterable) -> pa.Table:
    """A table of SCHEMA from FileEntry-like objects (attributes named as SCHEMA's columns)."""
    rows = list(map(_ROW, entries))
    return pa.table([list(col) for col in zip(*rows)] if rows else [[] for _ in SCHEMA.names], schema=SCHEMA)


def _private_file(path: str):
    """``path`` opened for binary writing, created (or truncated) with mode 0600 (case C10)."""
    return open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE), "wb")


def _split_dirs(table: pa.Table) -> tuple[pa.Table, pa.Table]:
    """``(file rows, directory rows)`` of a table of SCHEMA (directory rows: paths ending in '/');
    no copy when there are no directory rows."""
    is_dir = pc.ends_with(table.column("path"), DIR)
    if not pc.any(is_dir).as_py():
        return table, table.slice(0, 0)
    return table.filter(pc.invert(is_dir)), table.filter(is_dir)


class Manifest:
    """An immutable snapshot over an Arrow table (files, and directory rows: see the module's
    docstring); build with :meth:`from_entries` or :meth:`load`. The table is sorted by path on
    construction if it is not already. ``table``: the file rows only; ``dir_rows``: the rows of
    directories with nothing listed below them (paths end in '/')."""

    def __init__(self, table: pa.Table, dir_rows: pa.Table | None = None, index: pa.RecordBatch | None = None):
        if dir_rows is None:
            table = table.select(SCHEMA.names)
            if not _is_sorted(table.column("path")):
                table = table.sort_by("path")
            table, dir_rows = _split_dirs(table)
        # else: ``table`` and ``dir_rows`` are the file and directory rows of SCHEMA, sorted (a mapped copy)
        self.table = table
        self._set_dirs(dir_rows)
        # Binary search index: per record batch (every column cut at the same rows), its path
        # array, its columns' values by row (for lookup) and its last path.
        batches = [b for b in table.to_batches() if b.num_rows]
        self._chunks = [b.column("path") for b in batches]
        self._columns = [[_values(b.column(n)) for n in SCHEMA.names] for b in batches]  # row -> value
        self._starts = [0]
        for c in self._chunks:
            self._starts.append(self._starts[-1] + len(c))
        self._lasts = [c[-1].as_py() for c in self._chunks]
        self._dir_cache: OrderedDict[str, dict] = OrderedDict()
        self._dir_cache_size = 0
        self._dir_lock = threading.Lock()
        self._found: dict[str, tuple[FileEntry, int]] = {}  # cleared when full: O(1), no recency to keep
        self._searches = 0  # binary searches made (see _find)
        self._whole: dict[str, tuple[FileEntry, int]] | None = None  # every file's, once decoded (_found_whole)
        # a large manifest's, once built (_find), or its mapped copy's (``index``)
        self._index: _PathIndex | None = None if index is None else _PathIndex(index)

    def _set_dirs(self, dir_rows: pa.Table) -> None:
        """Take ``dir_rows`` (sorted, SCHEMA) as the directory rows."""
        self.dir_rows = dir_rows
        self._dirs = _Strings(dir_rows.column("path").combine_chunks())

    @classmethod
    def from_entries(cls, entries: Iterable) -> "Manifest":
        """From FileEntry objects (e.g. a UFS listing)."""
        return cls(entries_table(entries))

    @classmethod
    def load(cls, path: str) -> "Manifest":
        """Read a manifest file (Parquet, columns of SCHEMA). Raises OSError.
        A file of this SCHEMA is read as it is: ``pq.read_table`` imports ``pyarrow.dataset``,
        ~15 ms of every command's start; an older one is fitted to SCHEMA by it.

        A manifest of at least :data:`MAPPED_ROWS` rows is mapped from a copy beside the file
        (``PATH.arrow``, mode 0600, see :mod:`datacache.manifest_copy`), with the path index its
        look-ups then use from the start: every process reading the dataset shares one copy in the
        page cache. Its first load writes the copy, :data:`BATCH_ROWS` rows at a time, and maps
        it: no process decodes the whole file. A copy made from other bytes, or damaged, is not
        used and is written anew; while another process writes it, or where it cannot be written
        (a read-only home, a full device), the load decodes the file; a smaller manifest's load
        deletes a copy left from a larger one."""
        mapping = pa.memory_map(path)
        data = mapping.read_buffer()
        parquet = pq.ParquetFile(pa.BufferReader(data))
        if not parquet.schema_arrow.equals(SCHEMA):
            return cls(pq.read_table(path, schema=SCHEMA, memory_map=True))
        copy = path + MAPPED_SUFFIX
        if parquet.metadata.num_rows < MAPPED_ROWS:
            remove_copy(copy)
            return cls(parquet.read())
        source = digest(mapping.fileno(), data.size)
        mapped = read_copy(copy, source, SCHEMA)
        if mapped is None and write_copy(copy, SCHEMA, _CopyRows(parquet), source):
            # the batches it decoded are freed, but the allocator kept their pages (~85 MiB for a
            # million rows): handed back, so that the writer's RSS is a reader's
            pa.default_memory_pool().release_unused()
            mapped = read_copy(copy, source, SCHEMA)  # the copy just written, mapped
        if mapped is not None:
            rows, files, index = mapped
            return cls(rows.slice(0, files), rows.slice(files), index)
        return cls(parquet.read())

    def save(self, path: str) -> None:
        """Write atomically (temp file + rename), mode 0600; directory rows sorted among the files."""
        with _private_file(f"{path}.tmp") as f:
            pq.write_table(self._all_rows(), f, row_group_size=BATCH_ROWS)
        os.replace(f"{path}.tmp", path)

    def _all_rows(self) -> pa.Table:
        """Files and directory rows, sorted by path (as the manifest file holds them)."""
        if not self.dir_rows.num_rows:
            return self.table
        return pa.concat_tables([self.table, self.dir_rows]).sort_by("path")

    def equals(self, other: "Manifest") -> bool:
        """Whether ``other`` holds the same rows (files and directory rows)."""
        return self.table.equals(other.table) and self.dir_rows.equals(other.dir_rows)

    @property
    def file_num(self) -> int:
        return self.table.num_rows

    @property
    def total_size(self) -> int:
        """Sum of file sizes in bytes (ufsTotal)."""
        return pc.sum(self.table.column("size")).as_py() or 0

    def bytes_in_files_over(self, size: int) -> int:
        """Sum of the sizes (bytes) of the files larger than ``size`` bytes."""
        sizes = self.table.column("size")
        return pc.sum(pc.if_else(pc.greater(sizes, size), sizes, 0)).as_py() or 0

    # -- sorted-path search ----------------------------------------------------------------------
    def _lower_bound(self, key: str) -> int:
        """Index of the first row whose path is >= ``key`` (``file_num`` if none)."""
        c = bisect.bisect_left(self._lasts, key)
        if c == len(self._chunks):
            return self._starts[-1]
        return self._starts[c] + _first_at_least(self._chunks[c], key)

    def _path_at(self, i: int) -> str:
        c, j = self._chunk_of(i)
        return self._columns[c][0](j)

    def _range(self, prefix: str) -> tuple[int, int]:
        """Rows ``[lo, hi)`` whose path starts with ``prefix``."""
        if not prefix:
            return 0, self.file_num
        after = _after_prefix(prefix)  # '' when the prefix is all U+10FFFF: no path sorts after them
        return self._lower_bound(prefix), self._lower_bound(after) if after else self.file_num

    def _below(self, key: str) -> tuple[int, int]:
        """Rows ``[lo, hi)`` of the files below directory ``key`` (normalised; "" the root)."""
        return self._range(f"{key}/" if key else "")

    def rows(self, lo: int, hi: int) -> Iterator[FileEntry]:
        """The files of rows ``lo`` to ``hi - 1`` in path order (see :meth:`position`); rows past
        the last are none."""
        hi = min(hi, self.file_num)
        if hi - lo <= _FEW_ROWS:  # element access: ~4 µs a row; a slice ~11 µs for one row, ~16 µs for five
            return (self._entry_at(*self._chunk_of(i)) for i in range(lo, hi))
        return _entries(self.table.slice(lo, hi - lo))

    def _chunk_of(self, i: int) -> tuple[int, int]:
        """``(batch, index in it)`` of row ``i``."""
        c = bisect.bisect_right(self._starts, i) - 1
        return c, i - self._starts[c]

    def _entry_at(self, c: int, i: int, path: str | None = None) -> FileEntry:
        """The file of row ``i`` of batch ``c`` (``path``: its path when known): ~2.4 us, each value
        read from the batch's buffers (:func:`_values`), against ~4-5.5 µs through ``array[i].as_py()``
        and ~11 µs slicing a one-row table (2026-12-06)."""
        columns = self._columns[c]
        return FileEntry(columns[0](i) if path is None else path, *[value(i) for value in columns[1:]])

    # -- lookups ---------------------------------------------------------------------------------
    def lookup(self, path: str) -> FileEntry | None:
        """The file at dataset ``path`` (normalised), or None (also for directories)."""
        found = self._find(normalize(path))
        return found[0] if found is not None else None

    def position(self, path: str) -> int | None:
        """The row of the file at dataset ``path`` in path order (0 to ``file_num - 1``), or None
        (also for directories). A directory's files are consecutive rows in name order, with
        the files of its subdirectories among them where their names sort."""
        found = self._find(normalize(path))
        return found[1] if found is not None else None

    def _find(self, key: str) -> tuple[FileEntry, int] | None:
        """``(entry, row)`` of the file at normalised ``key``, or None (also for "", the root, even
        where a sync kept a file row of that path: a UFS key ``ROOT/.``)."""
        if not key:
            return None
        whole = self._whole
        if whole is not None:
            return whole.get(key)
        found = self._found.get(key)
        if found is None:
            index = self._index
            if index is None:
                self._searches += 1
                if self.file_num <= _FOUND_ENTRIES:
                    if self._searches * _WHOLE_AFTER >= self.file_num:
                        return self._found_whole().get(key)
                elif self._searches * _INDEX_AFTER >= self.file_num:
                    index = self._index = _PathIndex.build(self._chunks)
            found = self._search(key) if index is None else self._indexed(index, key)
            if found is not None:
                if len(self._found) >= _FOUND_ENTRIES:
                    self._found.clear()
                self._found[key] = found
        return found

    def _found_whole(self) -> dict[str, tuple[FileEntry, int]]:
        """Every file's ``(entry, row)`` by path, kept as the look-ups from now on: a reader that has
        searched for 1/16 of a small manifest's files is likely to open the rest (one worker of a
        DataLoader, one epoch), and decoding a row costs ~1.5 us against ~9 us a search (1,500
        rows: 2 ms; 16,384: 30 ms, 2026-12-06)."""
        whole = {entry.path: (entry, row) for row, entry in enumerate(_entries(self.table))}
        self._whole, self._found = whole, {}
        return whole

    def _search(self, key: str) -> tuple[FileEntry, int] | None:
        c = bisect.bisect_left(self._lasts, key)
        if c == len(self._chunks):
            return None
        chunk = self._chunks[c]
        i = _first_at_least(chunk, key)
        if i < len(chunk) and self._columns[c][0](i) == key:
            return self._entry_at(c, i, key), self._starts[c] + i
        return None

    def _indexed(self, index: "_PathIndex", key: str) -> tuple[FileEntry, int] | None:
        """As :meth:`_search`, through ``index``: a hash, a bisect and a path comparison."""
        row = index.find(key, self._path_at)
        return None if row is None else (self._entry_at(*self._chunk_of(row), key), row)

    def is_dir(self, path: str) -> bool:
        """Whether dataset ``path`` is a directory: the root, a prefix of a file's path or a
        directory row (an empty directory)."""
        key = normalize(path)
        if not key:
            return True
        prefix = key + "/"
        i = self._lower_bound(prefix)
        if i < self.file_num and self._path_at(i).startswith(prefix):
            return True
        j = bisect.bisect_left(self._dirs, prefix)  # the row 'key/' itself, or one below it
        return j < len(self._dirs) and self._dirs[j].startswith(prefix)

    def listdir(self, path: str) -> dict[str, FileEntry | None]:
        """Children of directory ``path``: name -> FileEntry, or None for a subdirectory.

        Raises FileNotFoundError / NotADirectoryError."""
        key = normalize(path)
        with self._dir_lock:  # readers on several threads (FUSE pool, data loader threads)
            children = self._dir_cache.get(key)
            if children is not None:
                self._dir_cache.move_to_end(key)
                return children
        if not self.is_dir(key):
            if self.lookup(key) is not None:
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", path)
            raise FileNotFoundError(errno.ENOENT, "no such file or directory in the dataset", path)
        children = self._children(key)
        with self._dir_lock:
            if len(children) <= _DIR_CACHE_ENTRIES and key not in self._dir_cache:
                self._dir_cache[key] = children
                self._dir_cache_size += len(children)
                while self._dir_cache_size > _DIR_CACHE_ENTRIES:
                    self._dir_cache_size -= len(self._dir_cache.popitem(last=False)[1])
        return children

    def _children(self, key: str) -> dict[str, FileEntry | None]:
        prefix = f"{key}/" if key else ""
        i, hi = self._range(prefix)
        children: dict[str, FileEntry | None] = {}
        step = 16  # rows converted at a time; doubles over runs of files, resets after a subdirectory
        while i < hi:
            n = min(step, hi - i)
            for offset, entry in enumerate(self.rows(i, i + n)):
                name, sep, _ = entry.path[len(prefix):].partition("/")
                if sep:  # a subdirectory: skip all its rows at once
                    children.setdefault(name, None)
                    i = self._lower_bound(_after_prefix(f"{prefix}{name}/"))
                    step = 16
                    break
                children[name] = entry
            else:
                i += n
                step = min(step * 2, BATCH_ROWS)
        # Directories with nothing listed below them: their rows under the prefix, one jump each.
        j = bisect.bisect_left(self._dirs, prefix)
        while j < len(self._dirs) and (row := self._dirs[j]).startswith(prefix):
            name = row[len(prefix):].partition("/")[0]
            if not name:  # the row of the directory being listed: it is empty
                j += 1
                continue
            children.setdefault(name, None)
            j = bisect.bisect_left(self._dirs, _after_prefix(f"{prefix}{name}/"))
        return children

    def __iter__(self) -> Iterator[FileEntry]:
        return _entries(self.table)

    def select(self, pattern: str) -> list[FileEntry]:
        """Files matching ``pattern``: a file, a directory (everything below it) or a glob
        (fnmatch, '*' also crosses '/'). An empty list when nothing matches."""
        key = normalize(pattern)
        entry = self.lookup(key) if key else None
        if entry is not None:
            return [entry]
        if self.is_dir(key):
            return list(self.rows(*self._below(key)))
        wild = min((key.find(c) for c in "*?[" if c in key), default=-1)
        if wild < 0:
            return []
        # Only paths that start with the literal part before the first wildcard can match.
        return [e for e in self.rows(*self._range(key[:wild])) if fnmatch.fnmatchcase(e.path, key)]

    def tree_size(self, directory: str) -> tuple[int, int]:
        """``(files of at least one byte, their bytes)`` below ``directory`` ("" the root), summed
        in Arrow without making entries: a tree of 1.28 million files (ImageNet's) in ~10 ms,
        against ~3 s and ~380 MiB of Python objects to list it (2026-12-06)."""
        lo, hi = self._below(normalize(directory))
        sizes = self.table.column("size").slice(lo, hi - lo)
        files = pc.sum(pc.cast(pc.greater(sizes, 0), pa.int64())).as_py() or 0
        return files, pc.sum(sizes).as_py() or 0

    def sample(self, directory: str, k: int) -> list[FileEntry]:
        """Up to ``k`` files below ``directory`` ("" the root), rows drawn at random without
        replacement (``random.sample``), empty files left out."""
        lo, hi = self._below(normalize(directory))
        picked = (self._entry_at(*self._chunk_of(r)) for r in random.sample(range(lo, hi), min(k, hi - lo)))
        return [e for e in picked if e.size]

    def diff(self, newer: "Manifest") -> ManifestDiff:
        """What changed from this snapshot to ``newer`` (complete lists, in memory); a directory
        that appeared or vanished is a path ending in '/' (see :func:`diff_batches`)."""
        cols = ["path", "version"]
        return diff_batches(self._all_rows().select(cols).to_batches(BATCH_ROWS),
                            newer._all_rows().select(cols).to_batches(BATCH_ROWS))

    def with_entry(self, entry: FileEntry | None, path: str) -> "Manifest":
        """A copy with ``path`` replaced by ``entry`` (or removed when ``entry`` is None); rows
        are spliced, not re-sorted. A directory row of an ancestor of ``entry`` goes (the
        directory is no longer empty)."""
        key = normalize(path)
        i = self._lower_bound(key)
        end = i + 1 if i < self.file_num and self._path_at(i) == key else i
        parts = [self.table.slice(0, i)]
        if entry is not None:
            parts.append(entries_table([entry]))
        parts.append(self.table.slice(end))
        dirs = self.dir_rows
        if entry is not None and dirs.num_rows:
            parents = key.split("/")[:-1]
            ancestors = pa.array(["/".join(parents[:n]) + DIR for n in range(1, len(parents) + 1)], pa.string())
            dirs = dirs.filter(pc.invert(pc.is_in(dirs.column("path"), value_set=ancestors)))
        spliced = Manifest(pa.concat_tables(parts))
        spliced._set_dirs(dirs)
        return spliced


def aligned_batches(streams: list[Iterable[pa.RecordBatch]]) -> Iterator[list[pa.Table]]:
    """Walk sorted streams in step. Each stream gives record batches whose first column is a path,
    sorted, unique within the stream. Each step yields one table per stream: its rows whose path
    is <= the step's frontier (the smallest last path among the batches in hand), so a path
    appears in exactly one step, in every stream that has it; None for a stream that gave no
    batch at all. Memory: one batch per stream."""
    iters = [iter(s) for s in streams]
    heads: list[pa.Table | None] = [None] * len(iters)
    while True:
        for i, it in enumerate(iters):
            while it is not None and (heads[i] is None or heads[i].num_rows == 0):
                batch = next(it, None)
                if batch is None:
                    iters[i] = it = None
                else:
                    heads[i] = pa.Table.from_batches([batch])
        lasts = [h.column(0)[-1].as_py() for h in heads if h is not None and h.num_rows]
        if not lasts:
            return
        frontier = min(lasts)
        step = []
        for i, head in enumerate(heads):
            if head is None:  # a stream that never gave a batch
                step.append(None)
                continue
            n = pc.sum(pc.less_equal(head.column(0), frontier)).as_py() or 0
            step.append(head.slice(0, n))
            heads[i] = head.slice(n)
        yield step


_EMPTY_PAIRS = pa.table({"path": pa.array([], pa.string()), "version": pa.array([], pa.string())})


class _DiffCollector:
    """Collects changes: every path in memory (``out`` None), or the first ``limit`` of each kind
    in memory and all of them in a Parquet file ``out`` (mode 0600)."""

    def __init__(self, out: str | None, limit: int | None):
        self.lists: dict[str, list[str]] = {c: [] for c in CHANGES}
        self.counts = dict.fromkeys(CHANGES, 0)
        self.out, self.limit = out, limit if out is not None else None
        self._file = self._writer = None
        if out is not None:
            self._file = _private_file(f"{out}.tmp")
            self._writer = pq.ParquetWriter(self._file, DIFF_SCHEMA)

    def add(self, change: str, paths: pa.Array) -> None:
        """Record ``paths`` (a string array, sorted, after every path recorded before)."""
        if not len(paths):
            return
        self.counts[change] += len(paths)
        kept = self.lists[change]
        room = len(paths) if self.limit is None else max(self.limit - len(kept), 0)
        kept.extend(paths.slice(0, room).to_pylist())
        if self._writer is not None:
            kinds = pa.array([change] * len(paths), pa.string())
            self._writer.write_table(pa.table([kinds, paths], schema=DIFF_SCHEMA))

    def result(self) -> ManifestDiff:
        if self._writer is not None:
            self._writer.close()
            self._file.close()
            os.replace(f"{self.out}.tmp", self.out)
        return ManifestDiff(self.lists["added"], self.lists["changed"], self.lists["deleted"],
                            tuple(self.counts[c] for c in CHANGES), self.out)


class _DirChanges:
    """Added (or deleted) paths of one kind on their way to a :class:`_DiffCollector`, less the
    directory rows ('d/') the other manifest has paths below: there the directory neither
    appeared nor vanished, it only got (or lost) its files. Whether the other side has a path
    below 'd/' is told by its first path after 'd/' (it has no 'd/' itself, and the side of
    'd/' has nothing below it); when that path is in a later step, 'd/' and the paths after it
    wait for that step (the collector takes paths in order)."""

    def __init__(self, collect: _DiffCollector, change: str):
        self.collect, self.change = collect, change
        self.waiting: pa.Array | None = None

    def decide(self, other: pa.Array | None) -> None:
        """Pass on the waiting paths, given the other side's paths of the next step (None at the
        end): its first path is the first after each waiting directory; none means nothing is
        below them (the step's frontier, a path of this side, is past them)."""
        if self.waiting is None:
            return
        first = other[0].as_py() if other is not None and len(other) else None
        self.collect.add(self.change, self._kept(self.waiting, lambda d: first is not None and first.startswith(d)))
        self.waiting = None

    def add(self, paths: pa.Array, other: pa.Array) -> None:
        """``paths``: this step's changes of the kind (sorted); ``other``: the other side's paths
        in the same step (sorted)."""
        dirs = pc.ends_with(paths, DIR)
        if not pc.any(dirs).as_py():
            self.collect.add(self.change, paths)
            return
        others = _Strings(other)
        below: set[str] = set()
        for i in pc.indices_nonzero(dirs).to_pylist():
            d = paths[i].as_py()
            j = bisect.bisect_left(others, d)
            if j == len(others):  # the other side's next path is in a later step
                self.waiting = paths.slice(i)
                paths = paths.slice(0, i)
                break
            if others[j].startswith(d):
                below.add(d)
        self.collect.add(self.change, self._kept(paths, below.__contains__))

    @staticmethod
    def _kept(paths: pa.Array, implied) -> pa.Array:
        keep = [not (p.endswith(DIR) and implied(p)) for p in paths.to_pylist()] if len(paths) else []
        return paths.filter(pa.array(keep, pa.bool_())) if not all(keep) else paths


def diff_batches(old: Iterable[pa.RecordBatch], new: Iterable[pa.RecordBatch], out: str | None = None,
                 limit: int = DIFF_LIMIT) -> ManifestDiff:
    """Diff two manifests given as streams of record batches of (path, version) columns, each
    sorted by path with unique paths: a merge join done a step of :func:`aligned_batches` at a
    time with Arrow kernels, in memory bounded by one batch of each. Directory rows (paths
    ending in '/', each with nothing below it on its own side) count only when the directory
    appeared or vanished (see :class:`_DirChanges`).

    With ``out`` (a file path), every change is also written there (Parquet, columns change and
    path, mode 0600) and the returned lists keep only the first ``limit`` paths of each kind;
    without it, the lists are complete.
    """
    collect = _DiffCollector(out, limit)
    added, deleted = _DirChanges(collect, "added"), _DirChanges(collect, "deleted")
    for o, n in aligned_batches([old, new]):
        o, n = o if o is not None else _EMPTY_PAIRS, n if n is not None else _EMPTY_PAIRS
        o_path, n_path = o.column("path").combine_chunks(), n.column("path").combine_chunks()
        added.decide(o_path)
        deleted.decide(n_path)
        in_old, in_new = pc.is_in(n_path, value_set=o_path), pc.is_in(o_path, value_set=n_path)
        added.add(n_path.filter(pc.invert(in_old)), o_path)
        # The paths in both, in the same (sorted) order on each side: compare versions row by row.
        both_new = n.filter(in_old)
        same = pc.equal(o.column("version").combine_chunks().filter(in_new),
                        both_new.column("version").combine_chunks())
        collect.add("changed", both_new.column("path").combine_chunks().filter(pc.invert(same)))
        deleted.add(o_path.filter(pc.invert(in_new)), n_path)
    added.decide(None)
    deleted.decide(None)
    return collect.result()
