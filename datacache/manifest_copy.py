"""A large manifest's mapped copy: its rows as an uncompressed Arrow IPC file that loads map
instead of decoding the Parquet file.

Decoding ImageNet's manifest (1.28 million files) costs every reading process 0.4 s and ~370 MiB
of private memory (each DataLoader worker: 8 workers, ~3 GB); mapping the copy costs milliseconds
and shares one copy in the page cache (2026-12-06, ``/tmp/mm/memman.py``). The first load writes
the copy from the Parquet file a row group at a time (``manifest._CopyRows``) and maps it too, so
no process holds the whole table decoded: a million files' first load took 0.64-0.74 s and left
the process 134 MB of RSS (74 before), where decoding them left 258 MB; later loads, 11-12 ms.

The file is the rows' Arrow IPC file, then the path index's (one batch of :data:`INDEX_SCHEMA`:
each file path's xxh3-64, sorted, with its row; see ``manifest._PathIndex``), then a trailer
(:data:`_TRAILER`): the xxh3-128 of the Parquet bytes it was made from, the number of file rows
(the directory rows follow them), where the rows' IPC file ends and the index's starts (at a
multiple of 64 bytes), the xxh3-128 of every byte before this checksum, and a magic. The index is
built once, by the writer: each reading process maps it (ImageNet's 1.28 million files: ~15 MB and
~0.4 s that every DataLoader worker spent building its own after 40,000 searches, each of those
~5-8 us against ~1.2-1.9 us through it). A load uses the copy only when the Parquet file it is
loading has the same checksum (a tag by content, not by inode or time: ext4 hands a freed inode
back and two saves in one clock tick share an mtime) and the copy's own checksum holds (a damaged
row is found, not served); otherwise the caller reads the Parquet file. Hashing both is most of a
mapped load's 11-12 ms (a million files).
Both are hashed with ``pread`` into one small buffer, not through the mapping: hashing through it
would fault every page into this process's RSS (the copy of a million files is 81 MB), where a load
only touches the rows it reads.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import struct
from typing import Iterator, Protocol

import pyarrow as pa
import xxhash

from datacache.private import FILE_MODE

log = logging.getLogger(__name__)

__all__ = ["INDEX_SCHEMA", "CopyRows", "digest", "read_copy", "remove_copy", "write_copy"]

_MAGIC = b"DCMCOPY2"  # 1: no path index
# source digest, file rows, end of the rows' IPC file, the index's offset, digest of all before it, magic
_TRAILER = struct.Struct("<16sQQQ16s8s")
_CHECKED = 16 + 8 + 8 + 8  # trailer bytes before its own digest, covered by it
INDEX_SCHEMA = pa.schema([("hash", pa.uint64()), ("row", pa.uint32())])
_ALIGN = 64  # bytes: the index's IPC file starts at a multiple of this (Arrow's buffer alignment)


_READ = 1 << 20  # bytes per pread while hashing


def _hashed(fd: int, size: int) -> xxhash.xxh3_128:
    """An xxh3-128 hasher fed the first ``size`` bytes of the file open as ``fd``, read with
    ``pread`` into one buffer of :data:`_READ` bytes. Raises OSError, EIO if the file is shorter."""
    hasher, buffer = xxhash.xxh3_128(), memoryview(bytearray(_READ))
    offset = 0
    while offset < size:
        got = os.preadv(fd, [buffer[:min(_READ, size - offset)]], offset)
        if not got:
            raise OSError(errno.EIO, f"the file ended at byte {offset} of {size}")
        hasher.update(buffer[:got])
        offset += got
    return hasher


def digest(fd: int, size: int) -> bytes:
    """xxh3-128 (16 bytes) of the first ``size`` bytes of the file open as ``fd`` (see
    :func:`_hashed`: nothing of it is mapped). Raises OSError."""
    return _hashed(fd, size).digest()


class CopyRows(Protocol):
    """What :func:`write_copy` copies: record batches, then ``tail()``: ``(file rows, path index)``
    (a batch of :data:`INDEX_SCHEMA`), once they are all read."""

    def __iter__(self) -> Iterator[pa.RecordBatch]: ...

    def tail(self) -> tuple[int, pa.RecordBatch]: ...


def read_copy(path: str, source: bytes, schema: pa.Schema) -> tuple[pa.Table, int, pa.RecordBatch] | None:
    """``(rows, file rows, index)`` of the copy at ``path`` made from the Parquet bytes whose
    :func:`digest` is ``source``: a table of ``schema`` and a batch of :data:`INDEX_SCHEMA` (one
    row a file) whose buffers are views of the mapping (no copy), the table's first ``file rows``
    rows the files. None when there is no such copy, when it was made from other bytes, or when it
    is damaged (logged)."""
    try:
        mapping = pa.memory_map(path)
        data = mapping.read_buffer()
        if data.size < _TRAILER.size:
            raise ValueError(f"{data.size} bytes: shorter than its trailer")
        end = data.size - _TRAILER.size
        made_from, files, rows_end, index_at, checksum, magic = _TRAILER.unpack(data.slice(end).to_pybytes())
        if magic != _MAGIC:
            raise ValueError("no trailer (or one of an older format)")
        if made_from != source:  # the copy of an earlier manifest: written anew by the caller
            return None
        if digest(mapping.fileno(), end + _CHECKED) != checksum:
            raise ValueError("checksum mismatch")
        if not 0 < rows_end <= index_at < end:
            raise ValueError(f"the rows' end {rows_end} and the index's offset {index_at} do not fit {end} bytes")
        rows = pa.ipc.open_file(data.slice(0, rows_end)).read_all()
        index = pa.ipc.open_file(data.slice(index_at, end - index_at))
        if not rows.schema.equals(schema) or not 0 <= files <= rows.num_rows:
            raise ValueError(f"not a manifest's rows ({files} files of {rows.num_rows} rows, {rows.schema})")
        if index.num_record_batches != 1 or not index.schema.equals(INDEX_SCHEMA):
            raise ValueError(f"not a path index ({index.num_record_batches} batches of {index.schema})")
        batch = index.get_batch(0)
        if batch.num_rows != files:
            raise ValueError(f"a path index of {batch.num_rows} rows for {files} files")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, pa.ArrowInvalid) as err:  # the caller reads the Parquet file and rewrites this
        log.warning("manifest copy %s not used: %s", path, err)
        return None
    return rows, files, batch


def write_copy(path: str, schema: pa.Schema, rows: CopyRows, source: bytes) -> bool:
    """Write ``rows`` (record batches of ``schema``: the file rows, then the directory rows) and
    the path index its ``tail()`` gives once they are all read, as the copy at ``path`` made from
    the Parquet bytes of :func:`digest` ``source``: temp file, fsync, rename, mode 0600. One
    process writes at a time (``flock`` on the temp file: DataLoader workers start together; the
    others go on without). True when the copy was written. Raises nothing: an ``OSError`` (a
    read-only home, a full device) or a ``ValueError`` from ``rows`` (rows it cannot copy) leaves
    the copy out, logged."""
    tmp = f"{path}.tmp"
    try:
        if not os.access(os.path.dirname(path) or ".", os.W_OK):  # its rename would fail after the writing
            raise PermissionError(errno.EACCES, "the directory is not writable", os.path.dirname(path))
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    except OSError as err:
        log.info("manifest copy %s not written (each load decodes the manifest): %s", path, err)
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # the name may have been renamed to ``path`` by the holder before: never truncate that
        if not os.path.samestat(os.fstat(fd), os.stat(tmp)):
            return False
        os.ftruncate(fd, 0)
        os.fchmod(fd, FILE_MODE)  # a temp file left by another writer may have had another mode
        with open(fd, "wb", closefd=False) as f:
            with pa.ipc.new_file(f, schema) as writer:
                for batch in rows:
                    writer.write_batch(batch)
            files, index = rows.tail()
            rows_end = f.tell()
            f.write(bytes(-rows_end % _ALIGN))  # the index's buffers aligned (an IPC file ends in "ARROW1")
            index_at = f.tell()
            with pa.ipc.new_file(f, INDEX_SCHEMA) as writer:
                writer.write_batch(index)
        checksum = _hashed(fd, os.fstat(fd).st_size)
        checksum.update(source + struct.pack("<QQQ", files, rows_end, index_at))  # the trailer's bytes before it
        trailer = _TRAILER.pack(source, files, rows_end, index_at, checksum.digest(), _MAGIC)
        if os.pwrite(fd, trailer, os.fstat(fd).st_size) != len(trailer):  # a file size limit met
            raise OSError(errno.EFBIG, "the trailer was written short")
        os.fsync(fd)  # on the device before its name is: a power loss leaves no copy with holes
        os.replace(tmp, path)
        return True
    except BlockingIOError:  # another process writes it now
        return False
    except (OSError, ValueError) as err:  # FileNotFoundError: renamed by the holder before
        if not isinstance(err, FileNotFoundError):
            log.info("manifest copy %s not written (each load decodes the manifest): %s", path, err)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return False
    finally:
        os.close(fd)


def remove_copy(path: str) -> None:
    """Delete the copy at ``path`` and its temp file if there are (its manifest shrank below the
    size that gets one: they would otherwise stay for ever); an error leaves them, harmless (the
    copy's tag no longer matches)."""
    for name in (path, f"{path}.tmp"):
        with contextlib.suppress(OSError):
            os.unlink(name)
