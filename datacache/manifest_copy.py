"""A large manifest's mapped copy: its rows as an uncompressed Arrow IPC file that loads map
instead of decoding the Parquet file.

Decoding ImageNet's manifest (1.28 million files) costs every reading process 0.4 s and ~370 MiB
of private memory (each DataLoader worker: 8 workers, ~3 GB); mapping the copy costs milliseconds
and shares one copy in the page cache (2026-12-06, ``/tmp/mm/memman.py``).

The file is the Arrow IPC file followed by a trailer (:data:`_TRAILER`): the xxh3-128 of the
Parquet bytes it was made from, the number of file rows (the directory rows follow them), the
xxh3-128 of every byte before this checksum, and a magic. A load uses the copy only when the
Parquet file it is loading has the same checksum (a tag by content, not by inode or time: ext4
hands a freed inode back and two saves in one clock tick share an mtime) and the copy's own
checksum holds (a damaged row is found, not served); otherwise the caller reads the Parquet file.
Hashing both at load costs ~25 ms for ImageNet's (xxh3 at memory speed), against 0.4 s decoding.
Both are hashed with ``pread`` into one small buffer, not through the mapping: hashing through
it would fault every page into this process's RSS (the copy of a million files is 81 MB), where
a load only touches the rows it reads.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import struct

import pyarrow as pa
import xxhash

from datacache.private import FILE_MODE

log = logging.getLogger(__name__)

__all__ = ["digest", "read_copy", "remove_copy", "write_copy"]

_MAGIC = b"DCMCOPY1"
_TRAILER = struct.Struct("<16sQ16s8s")  # source digest, file rows, digest of all before it, magic
_CHECKED = 16 + 8  # trailer bytes before its own digest, covered by it


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


def read_copy(path: str, source: bytes, schema: pa.Schema) -> tuple[pa.Table, int] | None:
    """``(rows, file rows)`` of the copy at ``path`` made from the Parquet bytes whose
    :func:`digest` is ``source``: a table of ``schema`` whose buffers are views of the mapping
    (no copy), its first ``file rows`` rows the files. None when there is no such copy, when it was
    made from other bytes, or when it is damaged (logged)."""
    try:
        mapping = pa.memory_map(path)
        data = mapping.read_buffer()
        if data.size < _TRAILER.size:
            raise ValueError(f"{data.size} bytes: shorter than its trailer")
        made_from, files, checksum, magic = _TRAILER.unpack(data.slice(data.size - _TRAILER.size).to_pybytes())
        if magic != _MAGIC:
            raise ValueError("no trailer")
        if made_from != source:  # the copy of an earlier manifest: written anew by the caller
            return None
        if digest(mapping.fileno(), data.size - _TRAILER.size + _CHECKED) != checksum:
            raise ValueError("checksum mismatch")
        rows = pa.ipc.open_file(data.slice(0, data.size - _TRAILER.size)).read_all()
        if not rows.schema.equals(schema) or not 0 <= files <= rows.num_rows:
            raise ValueError(f"not a manifest's rows ({files} files of {rows.num_rows} rows, {rows.schema})")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, pa.ArrowInvalid) as err:  # the caller reads the Parquet file and rewrites this
        log.warning("manifest copy %s not used: %s", path, err)
        return None
    return rows, files


def write_copy(path: str, rows: pa.Table, files: int, source: bytes, chunk_rows: int) -> None:
    """Write ``rows`` (its first ``files`` rows the files) as the copy at ``path`` made from the
    Parquet bytes of :func:`digest` ``source``, in batches of ``chunk_rows`` rows: temp file,
    fsync, rename, mode 0600. One process writes at a time (``flock`` on the temp file: DataLoader
    workers start together; the others go on without). Raises nothing: an ``OSError`` (a
    read-only home, a full device) leaves the copy out, logged."""
    tmp = f"{path}.tmp"
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    except OSError as err:
        log.info("manifest copy %s not written (each load decodes the manifest): %s", path, err)
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # the name may have been renamed to ``path`` by the holder before: never truncate that
        if not os.path.samestat(os.fstat(fd), os.stat(tmp)):
            return
        os.ftruncate(fd, 0)
        with open(fd, "wb", closefd=False) as f, pa.ipc.new_file(f, rows.schema) as writer:
            writer.write_table(rows, max_chunksize=chunk_rows)
        checksum = _hashed(fd, os.fstat(fd).st_size)
        checksum.update(source + struct.pack("<Q", files))  # the trailer's bytes before the checksum
        trailer = _TRAILER.pack(source, files, checksum.digest(), _MAGIC)
        if os.pwrite(fd, trailer, os.fstat(fd).st_size) != len(trailer):  # a file size limit met
            raise OSError(errno.EFBIG, "the trailer was written short")
        os.fsync(fd)  # on the device before its name is: a power loss leaves no copy with holes
        os.replace(tmp, path)
    except BlockingIOError:  # another process writes it now
        pass
    except OSError as err:  # FileNotFoundError: renamed by the holder before
        if not isinstance(err, FileNotFoundError):
            log.info("manifest copy %s not written (each load decodes the manifest): %s", path, err)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    finally:
        os.close(fd)


def remove_copy(path: str) -> None:
    """Delete the copy at ``path`` if there is one (its manifest shrank below the size that gets
    one: it would otherwise stay for ever); an error leaves it, harmless (its tag no longer matches)."""
    with contextlib.suppress(OSError):
        os.unlink(path)
