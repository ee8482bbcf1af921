"""File tier: complete file versions as contiguous local files, for kernel FUSE passthrough and
plain local file objects (issue 17, items 5 and 6).

The block tiers keep a file as many block files; passthrough needs ONE local file whose bytes are
the whole version. This tier keeps such files, node-local, under its own quota.

Layout: one directory (0700) of its own (the sweep below deletes files named as its own that no
index row names, so no other tier may share it), holding
- ``<file id>``: the complete bytes of one file version (0600), named by its
  :func:`~datacache.cache.blocks.file_id` (mount, UFS path, version, block size), never by a
  user path;
- ``<file id>.<token>.tmp``: a file being written, under an exclusive ``flock`` held by its writer
  for as long as it writes;
- ``index.db``: SQLite, one row per complete file (file id, size, last access, xxh3-64 of the whole
  file, the :func:`~datacache.cache.boot.boot_mark` of the boot it was last checked in) and one per
  write in flight (temp name, file id, size reserved);
- ``.lock``: the ``flock`` that orders index changes and evictions across processes (a thread lock
  orders them within one).

Quota (cases C1, C2): a write reserves its size in the index before it writes a byte. When the
complete files plus the reservations plus the index would pass the high watermark, least recently
used files are evicted until they fit under the low one; a file that cannot fit under the high
watermark even in an empty tier is refused (``ValueError``) with nothing written. A writer never
writes past its reservation, so the bytes under the directory never pass the quota, however many
threads and processes write at once. Last accesses are kept in memory and written to the index
at most once per ``ACCESS_FLUSH_S`` seconds and before every eviction (as in the disk tier).

Eviction unlinks a file, never truncates it or punches holes in it: a reader holding it open (a
passthrough backing file, an ``mmap``) keeps reading the complete old bytes, and the device frees
its space when the last such reader closes it. The index row goes first, then the file (the order
diskcache uses), so no process hands out a file being deleted.

Crash safety: a file is written under its temp name and renamed to its final name only once
complete, with its index row, under the lock; so the final name never shows a partial file. No
``fsync`` (a cache refills from its source): after a power loss, a renamed file may lack data the
kernel had not written yet, which the first-use check below then finds. A temp file whose writer
died (its ``flock`` is free) is deleted, with its reservation, when a tier opens the directory and
before any eviction; so are final-name files without an index row and rows without a file.

Integrity, what is verified when:
- the blocks a file is built from are verified by the block tier that serves them (xxh3-64 per
  block on every disk read, see :mod:`datacache.cache.disk`); :meth:`FileTier.materialize` hashes
  the bytes as it writes them and stores that whole-file xxh3-64 in the index;
- a file is checked (its size, then its whole-file xxh3-64) the first time a :class:`FileTier`
  hands it out after the machine booted, unless it was written or checked in this boot (the
  ``checked`` mark in its row, shared by the processes of the boot): so after a power loss (a new
  boot) every file is read once before it is trusted. A file failing the check is dropped and
  :meth:`FileTier.path` answers None (the caller reads through the blocks);
- :meth:`FileTier.verify` re-reads every file (the ``datacache verify`` scrub) and drops the
  damaged ones.
Between those checks a file handed out is not re-read: a byte damaged on the device while the
machine runs is found by the scrub or after the next reboot, the same trade-off as JuiceFS's
``--verify-cache-checksum=full`` default (checks when a cached block is loaded, not on every read).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable

import xxhash

from datacache import private
from datacache.cache.blocks import PIECE, PieceBlock, block_count
from datacache.cache.boot import boot_mark
from datacache.entry import FileEntry

log = logging.getLogger(__name__)
ACCESS_FLUSH_S = 1.0  # seconds between two writes of the files' last accesses to the index
_INDEX = "index.db"
_INDEX_FILES = (_INDEX, _INDEX + "-journal", _INDEX + "-wal", _INDEX + "-shm")
_FINAL = re.compile(r"[0-9a-f]{32}")
_TEMP = re.compile(r"[0-9a-f]{32}\.[0-9a-f]{32}\.tmp")
_SCHEMA = ("CREATE TABLE IF NOT EXISTS files (fid TEXT PRIMARY KEY, size INTEGER NOT NULL, "
           "atime REAL NOT NULL, digest TEXT NOT NULL, checked INTEGER NOT NULL DEFAULT 0)",
           "CREATE INDEX IF NOT EXISTS files_atime ON files (atime)",
           "CREATE TABLE IF NOT EXISTS writes (temp TEXT PRIMARY KEY, fid TEXT NOT NULL, size INTEGER NOT NULL)")


class MissingBlock(Exception):
    """Raised by a block iterable given to :meth:`FileTier.materialize` to give up the write
    (a block is no longer cached): the temp file and its reservation are dropped."""


class FileTier:
    """Complete file versions under ``directory``, at most ``quota_bytes`` bytes on disk, evicted
    least recently used first from the ``high`` to the ``low`` watermark (fractions of the quota).

    Opening sweeps what crashed writers left (see the module docstring); a damaged index is
    deleted with a warning, and the files it indexed with it (the sweep: no row names them).
    Raises ``ValueError`` for watermarks outside ``0 < low <= high <= 1``; ``OSError`` or
    ``sqlite3.Error`` when the directory cannot be used (read-only, not ours): a caller then
    reads through the block tiers.
    Counters (this instance): ``evictions``, ``dropped`` (files that failed a check).
    """

    def __init__(self, directory: str, quota_bytes: int, high: float = 0.95, low: float = 0.8):
        if not 0 < low <= high <= 1:
            raise ValueError(f"file tier {directory}: watermarks must satisfy 0 < low <= high <= 1 "
                             f"(got high={high}, low={low})")
        self.directory = os.path.abspath(directory)
        self.capacity = quota_bytes
        self._high = int(quota_bytes * high)
        self._low = int(quota_bytes * low)
        private.makedirs(self.directory)
        self._lock = threading.Lock()
        self._lock_fd = os.open(private.touch(os.path.join(self.directory, ".lock")), os.O_RDWR | os.O_CLOEXEC)
        self._verified: set[str] = set()  # files this instance wrote or checked
        self._accessed: dict[str, float] = {}
        self._flushed = time.monotonic()
        self.evictions = 0
        self.dropped = 0
        try:
            with self._exclusive():
                self._db = self._open_index()
                self._sweep()
        except BaseException:
            os.close(self._lock_fd)
            raise

    def _open_index(self) -> sqlite3.Connection:
        """The index (under the lock); a damaged one is deleted and made anew."""
        try:
            return self._connect()
        except sqlite3.DatabaseError as err:
            if getattr(err, "sqlite_errorcode", None) not in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
                raise
            # Without its digests no file can be checked: start again empty.
            log.warning("file tier %s: damaged index %s (%s): deleted with the files it indexed",
                        self.directory, os.path.join(self.directory, _INDEX), err)
            for name in _INDEX_FILES:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.directory, name))
            return self._connect()

    def _connect(self) -> sqlite3.Connection:
        """The index, created if missing (0600); raises ``sqlite3.DatabaseError`` when damaged."""
        db = sqlite3.connect(os.path.join(self.directory, _INDEX), timeout=60, isolation_level=None,
                             check_same_thread=False)
        try:
            os.chmod(os.path.join(self.directory, _INDEX), private.FILE_MODE)
            for statement in _SCHEMA:
                db.execute(statement)
            if "checked" not in {row[1] for row in db.execute("PRAGMA table_info(files)")}:  # an older index
                db.execute("ALTER TABLE files ADD COLUMN checked INTEGER NOT NULL DEFAULT 0")
        except BaseException:
            db.close()
            raise
        return db

    # -- reading -------------------------------------------------------------------------------

    def contains(self, fid: str) -> bool:
        """True when a complete file of version ``fid`` is indexed (not checked: see :meth:`path`)."""
        with self._lock:
            return self._db.execute("SELECT 1 FROM files WHERE fid = ?", (fid,)).fetchone() is not None

    __contains__ = contains

    def path(self, fid: str) -> str | None:
        """Path of the complete, checked file of version ``fid``, or None (absent, or dropped now
        for failing its first check in this boot). Marks it recently used. The file may be
        evicted right after: a caller opening it handles ``FileNotFoundError`` (see :meth:`open`).
        Raises ``ValueError`` for a malformed ``fid`` (see :meth:`materialize`)."""
        _check_fid(fid)
        with self._lock:
            row = self._db.execute("SELECT size, digest, checked FROM files WHERE fid = ?", (fid,)).fetchone()
        if row is None:
            return None
        if fid not in self._verified and row[2] != boot_mark() and not self._check(fid, *row[:2]):
            return None
        self._note_access(fid)
        return os.path.join(self.directory, fid)

    def open(self, fid: str) -> int | None:
        """A read-only descriptor of the complete, checked file of version ``fid``, or None (as
        :meth:`path`). The caller closes it. Eviction after this never changes what it reads."""
        full = self.path(fid)
        if full is None:
            return None
        try:
            return os.open(full, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:  # evicted between the lookup and the open
            return None

    def used(self) -> int:
        """Bytes counted against the quota: complete files, reservations of writes in flight, and
        the index (its database and journal files)."""
        with self._lock:
            return self._used()

    def _used(self) -> int:
        files, writes = self._db.execute(
            "SELECT (SELECT COALESCE(SUM(size), 0) FROM files), (SELECT COALESCE(SUM(size), 0) FROM writes)").fetchone()
        return files + writes + self._index_bytes()

    def _index_bytes(self) -> int:
        total = 0
        for name in _INDEX_FILES:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(self.directory, name)).st_size
        return total

    # -- writing -------------------------------------------------------------------------------

    def materialize(self, fid: str, size: int, blocks: Iterable) -> str | None:
        """Write version ``fid`` (``size`` bytes) from ``blocks``, consecutive bytes-like objects or
        :class:`~datacache.cache.blocks.PieceBlock` s already verified by their source, and
        return its path. ``fid``: 32 hex digits (a :func:`~datacache.cache.blocks.file_id`).

        The size is reserved against the quota first (evicting as the module docstring says),
        then the bytes go to a temp file in the directory, which is renamed to its final name once all
        ``size`` bytes are written. Returns the existing path when the version is already
        complete; None (nothing kept) when another writer is writing it now, when the writes in
        flight leave no room for it now, or when ``blocks`` raised :class:`MissingBlock`. Raises
        ``ValueError`` for a malformed ``fid``, when ``size`` cannot fit under
        the high watermark (nothing written), or when ``blocks`` hold more or fewer than ``size``
        bytes (the temp file is deleted); ``OSError`` from the device (idem)."""
        _check_fid(fid)
        if size > self._high:
            raise ValueError(f"file tier {self.directory}: file {fid} of {size} bytes does not fit: quota "
                             f"{self.capacity} bytes, high watermark {self._high} bytes (raise the file tier's quota)")
        temp = f"{fid}.{uuid.uuid4().hex}.tmp"
        with self._exclusive():
            if self._db.execute("SELECT 1 FROM files WHERE fid = ?", (fid,)).fetchone() is not None:
                done = True
            elif self._writing(fid) or not self._reserve(size):
                return None
            else:
                done = False
                fd = os.open(os.path.join(self.directory, temp), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                             private.FILE_MODE)
                fcntl.flock(fd, fcntl.LOCK_EX)  # held while writing: the sweep's proof that we live
                self._db.execute("INSERT INTO writes VALUES (?, ?, ?)", (temp, fid, size))
        if done:
            return self.path(fid)
        try:
            digest = _write(fd, size, blocks, fid)
        except MissingBlock:
            self._abandon(fd, temp)
            return None
        except BaseException:
            self._abandon(fd, temp)
            raise
        try:
            with self._exclusive():
                os.rename(os.path.join(self.directory, temp), os.path.join(self.directory, fid))
                with self._db:
                    self._db.execute("BEGIN IMMEDIATE")
                    self._db.execute("DELETE FROM writes WHERE temp = ?", (temp,))
                    self._db.execute("INSERT INTO files (fid, size, atime, digest, checked) VALUES (?, ?, ?, ?, ?)",
                                     (fid, size, time.time(), digest, boot_mark()))  # hashed as written
                self._verified.add(fid)
        except BaseException:
            self._abandon(fd, temp)
            raise
        os.close(fd)
        return os.path.join(self.directory, fid)

    def _writing(self, fid: str) -> bool:
        """True when a live writer is writing ``fid`` (a dead one's temp file is swept now)."""
        rows = self._db.execute("SELECT temp FROM writes WHERE fid = ?", (fid,)).fetchall()
        return any(not self._sweep_temp(temp) for temp, in rows)

    def _reserve(self, size: int) -> bool:
        """Make room for ``size`` more bytes (under the lock): past the high watermark, drop dead
        writers' reservations, then evict least recently used files down to the low one. False
        when the other writes in flight leave no room under the high watermark even then."""
        if self._used() + size <= self._high:
            return True
        for temp, in self._db.execute("SELECT temp FROM writes").fetchall():
            self._sweep_temp(temp)
        self._flush_accesses()
        excess = self._used() + size - self._low
        for fid, fsize in self._db.execute("SELECT fid, size FROM files ORDER BY atime").fetchall():
            if excess <= 0:
                break
            self._delete(fid)
            self.evictions += 1
            excess -= fsize
        return self._used() + size <= self._high

    def _abandon(self, fd: int, temp: str) -> None:
        with self._exclusive():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.directory, temp))
            self._db.execute("DELETE FROM writes WHERE temp = ?", (temp,))
            os.close(fd)

    def _delete(self, fid: str) -> None:
        """Drop ``fid``'s row, then unlink its file (under the lock). Readers holding it open keep
        their bytes: the file is unlinked, never truncated."""
        self._db.execute("DELETE FROM files WHERE fid = ?", (fid,))
        self._verified.discard(fid)
        self._accessed.pop(fid, None)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.directory, fid))

    # -- checking ------------------------------------------------------------------------------

    def verify(self, fid: str | None = None) -> list[str]:
        """Re-read ``fid`` (default: every file) and drop each whose size or whole-file xxh3-64
        differs from its index row (the ``datacache verify`` scrub). Returns the dropped file ids."""
        with self._lock:
            rows = self._db.execute("SELECT fid, size, digest FROM files" + (" WHERE fid = ?" if fid else ""),
                                    (fid,) if fid else ()).fetchall()
        return [f for f, size, digest in rows if not self._check(f, size, digest)]

    def _check(self, fid: str, size: int, digest: str) -> bool:
        """Read the file whole and compare with its row (``size`` bytes, xxh3-64 ``digest``); a
        mismatch or a read error drops it (counted, with a warning), as does a missing file."""
        full = os.path.join(self.directory, fid)
        try:
            found = _digest(full, size)
        except FileNotFoundError:  # evicted meanwhile by another process, or lost: not damage
            found = None
        except OSError as err:  # EIO: the device cannot give its bytes back
            found = f"unreadable ({err})"
        if found == digest:
            self._verified.add(fid)
            # The other processes of this boot trust it now; an index that cannot take the mark
            # (a full device) only leaves them to check it themselves.
            with self._exclusive(), contextlib.suppress(sqlite3.Error):
                self._db.execute("UPDATE files SET checked = ? WHERE fid = ? AND digest = ?",
                                 (boot_mark(), fid, digest))
            return True
        with self._exclusive():
            row = self._db.execute("SELECT digest FROM files WHERE fid = ?", (fid,)).fetchone()
            if row is not None and row[0] == digest:  # still the file we read (not rewritten since)
                if found is not None:
                    log.warning("file tier %s: file %s failed its check (%s bytes and xxh3 %s expected, found %s): "
                                "dropped", self.directory, fid, size, digest, found)
                    self.dropped += 1
                self._delete(fid)
        return False

    # -- access times, sweep, locking ------------------------------------------------------------

    def _note_access(self, fid: str) -> None:
        with self._lock:
            self._accessed[fid] = time.time()
            if time.monotonic() - self._flushed >= ACCESS_FLUSH_S:
                self._flush_accesses()

    def _flush_accesses(self) -> None:
        """Write this instance's recorded accesses in one transaction (under the thread lock)."""
        accessed, self._accessed = self._accessed, {}
        self._flushed = time.monotonic()
        if accessed:
            with self._db:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.executemany("UPDATE files SET atime = MAX(atime, ?) WHERE fid = ?",
                                     [(t, f) for f, t in accessed.items()])

    def _sweep(self) -> None:
        """Delete what crashes left (under the lock): temp files and reservations of dead writers,
        final-name files without an index row, and rows without a file."""
        for temp, in self._db.execute("SELECT temp FROM writes").fetchall():
            self._sweep_temp(temp)
        indexed = {fid for fid, in self._db.execute("SELECT fid FROM files")}
        names = set(os.listdir(self.directory))
        for name in names:
            if _TEMP.fullmatch(name):
                self._sweep_temp(name)
            elif _FINAL.fullmatch(name) and name not in indexed:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.directory, name))
        gone = indexed - names
        if gone:
            self._db.executemany("DELETE FROM files WHERE fid = ?", [(f,) for f in gone])

    def _sweep_temp(self, temp: str) -> bool:
        """Delete temp file ``temp`` and its reservation when its writer is dead (its ``flock`` can
        be taken, or the file is gone); returns True when it did."""
        full = os.path.join(self.directory, temp)
        try:
            fd = os.open(full, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            fd = None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # its writer is alive
            finally:
                os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(full)
        self._db.execute("DELETE FROM writes WHERE temp = ?", (temp,))
        return True

    @contextlib.contextmanager
    def _exclusive(self):
        """The thread lock, then the directory's ``flock`` (threads share one descriptor, so the
        ``flock`` alone would not exclude them)."""
        with self._lock:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Write the recorded accesses and close the index."""
        with self._lock:
            if self._db is None:
                return
            with contextlib.suppress(sqlite3.Error):  # a failing device loses only LRU order
                self._flush_accesses()
            self._db.close()
            self._db = None
            os.close(self._lock_fd)

    def __enter__(self) -> "FileTier":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _write(fd: int, size: int, blocks: Iterable, fid: str) -> str:
    """Write ``blocks`` to ``fd`` and return the xxh3-64 hex digest of the ``size`` bytes written.
    Raises ``ValueError`` when they hold more or fewer bytes (never writes past ``size``)."""
    digest = xxhash.xxh3_64()
    written = 0
    for block in blocks:
        for piece in block.pieces if isinstance(block, PieceBlock) else (block,):
            view = memoryview(piece).cast("B")
            if written + len(view) > size:
                raise ValueError(f"file {fid}: blocks hold more than the {size} bytes announced")
            digest.update(view)
            written += len(view)
            while view:
                view = view[os.write(fd, view):]
    if written != size:
        raise ValueError(f"file {fid}: blocks hold {written} bytes, {size} announced")
    return digest.hexdigest()


def _check_fid(fid: str) -> None:
    """Raise ``ValueError`` unless ``fid`` is a file id (32 hex digits): it becomes a file name."""
    if not isinstance(fid, str) or not _FINAL.fullmatch(fid):
        raise ValueError(f"malformed file id {fid!r}: expected 32 hex digits (datacache.cache.blocks.file_id)")


def _digest(path: str, size: int) -> str:
    """xxh3-64 hex digest of the file at ``path``, or what is wrong when it does not hold ``size``
    bytes. Raises ``OSError`` (``FileNotFoundError`` when it is gone)."""
    digest = xxhash.xxh3_64()
    with open(path, "rb", buffering=0) as f:
        found = os.fstat(f.fileno()).st_size
        if found != size:
            return f"{found} bytes"
        buf = bytearray(PIECE)
        while n := f.readinto(buf):
            digest.update(memoryview(buf)[:n])
    return digest.hexdigest()


def materialize_entry(tier: FileTier, source, entry: FileEntry) -> str | None:
    """Build the complete file of ``entry``'s version in ``tier`` from ``source`` (a block source:
    ``block_size``, ``key``, ``is_cached``, ``get``; see :mod:`datacache.cache.local_source`) when every
    block of it is cached, and return its path; None when a block is not cached (also when it is
    evicted while the file is written), or another writer is writing it now.

    Blocks are read through ``source.get`` (so verified by the block tier) only after
    ``source.is_cached`` said yes, just before: nothing is read from the UFS, except for a block
    evicted in the instant between those two calls, which the source then fills as any read
    would. The file is named by the version's block-0 file id: the same id FUSE and
    ``datacache://`` compute with ``source.key(entry, 0).file_id``. Raises as
    :meth:`FileTier.materialize` does (``ValueError`` for a file too large for the tier)."""
    n = block_count(entry.size, source.block_size)
    fid = source.key(entry, 0).file_id
    if tier.contains(fid):
        return tier.path(fid)
    if not all(source.is_cached(entry, i) for i in range(n)):
        return None

    def blocks():
        for i in range(n):
            if not source.is_cached(entry, i):
                raise MissingBlock(f"block {i} of {entry.path} is no longer cached")
            yield source.get(entry, i, pieces=True)

    return tier.materialize(fid, entry.size, blocks())
