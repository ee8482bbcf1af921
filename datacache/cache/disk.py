"""SSD/HDD tier: block files under one cache directory, indexed by diskcache.

Layout and safety:
- diskcache keeps the index (key, size, access time, checksum as its ``tag``) in SQLite and each
  block in its own file; directories are created 0700 and block files 0600, so a second local user
  cannot read cached data (case C10).
- The quota counts what is on disk under the directory (block files, the SQLite database and its
  WAL). A put takes an exclusive lock (a thread lock plus ``flock`` for other processes sharing the
  directory), evicts least recently used blocks from the high to the low watermark when the new
  block would pass the high mark, then writes. So the quota holds while many fills run at once
  (cases C1, C2), across processes, with at most the block being written in flight.
- Every block is verified against its xxh3 checksum when read; a corrupt block is dropped and
  reported as a miss, so the caller refetches it and never returns wrong bytes.
- A hit writes nothing to the index (a write transaction per read cost more than the read and
  serialised reader processes on SQLite's write lock): its access time is kept in memory and
  written with the others once per ``ACCESS_FLUSH_S`` seconds and before every eviction, so LRU
  order holds in this process and is at most that late across processes.
- A process killed while storing a block leaves a file with no index row; such files, once older
  than ``ORPHAN_GRACE_S``, are deleted by a sweep when a tier opens the directory (one sweep per
  directory per ``ORPHAN_GRACE_S``, whichever process opens it first). An index with no rows
  (new, or emptied under us) names no file: every block file then found is deleted at open, whatever
  its age, so the quota counts all that is there.
- An index row whose block file is gone or shorter than indexed (deleted or truncated behind the
  cache's back) is dropped when found: by a read, by a presence check (``in``: one ``stat``,
  what warmup skips by) and by :meth:`DiskTier.present_keys` (what status counts); so status and
  warmup follow what is on disk, not the index (issue 18, as JuiceFS #6513 and Fluid #633).
  :meth:`DiskTier.verify` also reads the block and checks its checksum (``warmup --check``).
- A damaged index (SQLite "file is not a database", "database disk image is malformed"), found at
  open or by a later read or write, is deleted with a warning naming the directory, with the block
  files it indexed (unverifiable without their checksums); the tier starts again empty.
- A failing device never fails a read. A device that fills before the quota (ENOSPC, SQLite "disk
  is full") evicts to the low watermark and tries once more, else skips caching that block; any
  other write or index error (read-only or vanished directory, EIO) marks the tier unhealthy: it
  then caches nothing and reports misses, so blocks come from the UFS, and is tried again after
  ``RECHECK_S`` seconds. A directory that cannot be opened at start-up (read-only, not ours)
  starts the tier unhealthy the same way, with a warning naming the directory and the fix.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import io
import logging
import os
import sqlite3
import threading
import time

import diskcache
import xxhash

from datacache import private
from datacache.cache.blocks import PIECE, PieceBlock, checksum

log = logging.getLogger(__name__)
RECHECK_S = 30.0  # seconds an unhealthy tier is left alone before a write is tried again
ORPHAN_GRACE_S = 600.0  # an unindexed block file older than this is a crash's leftover
ACCESS_FLUSH_S = 1.0  # seconds between two writes of the blocks' access times to the index
ROWS_KEPT = 16384  # index rows of recent hits kept in memory (~3 MiB): a hit without a SELECT
_INDEX_FILES = ("cache.db", "cache.db-wal", "cache.db-shm")  # diskcache's SQLite index and its WAL
_SELECT_BLOCK = "SELECT filename, tag, size FROM Cache WHERE key = ? AND raw = 1 AND filename IS NOT NULL"


def _read_block(path: str, size: int) -> bytes:
    """The bytes of the file at ``path``, expected to be ``size`` long (its index row says so):
    ``os.open`` + one ``os.read`` of ``size + 1`` bytes, where a Python file object adds two
    ``fstat``, an ``lseek`` and a read at EOF (a 100 KB block: 33 µs against 41 µs). A file
    shorter or longer than ``size`` comes back so (up to one byte more), and the caller's checksum
    then finds it corrupt. Raises ``OSError`` (``FileNotFoundError`` when the file is gone)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, size + 1)
        while len(data) < size:  # a short read of a regular file: a signal, or EOF (truncated)
            more = os.read(fd, size + 1 - len(data))
            if not more:
                break
            data += more
        return data
    finally:
        os.close(fd)


@functools.cache
def _prime_malloc() -> None:
    """Free one 16 MiB buffer, once per process. glibc's malloc raises its mmap threshold to the
    largest mmap-backed chunk freed (up to 32 MiB) and its trim threshold to twice that (mallopt(3),
    M_MMAP_THRESHOLD: the dynamic threshold); with the default 128 KiB it handed every freed 4 MiB
    block back to the kernel, and the next block read faulted in 1,024 zeroed pages (warm reads of a
    512 MiB file through ``datacache://``: 4.6 GB/s before, 7.6 GB/s after). The cost: up to 32 MiB
    of freed memory kept per malloc arena. Other C libraries: a harmless allocation."""
    bytearray(16 << 20)


def _read_pieces(path: str, size: int) -> tuple[PieceBlock, str]:
    """As :func:`_read_block`, in :data:`PIECE`-byte reads for a reader: ``(the block, the xxh3-64
    hex digest of every byte read)``, each piece hashed while it is still in the CPU's cache (one
    hash of a 4 MiB block read in one go runs from memory, ~3x the cost). A file longer than
    ``size`` adds one byte to the digest, a shorter one lacks some: either way it differs."""
    _prime_malloc()
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        digest = xxhash.xxh3_64()  # streaming xxh3 equals the one-shot checksum() of the whole
        pieces = []
        got = 0
        while got < size:
            want = min(PIECE, size - got)
            piece = os.read(fd, want)
            while 0 < len(piece) < want:  # a signal, or EOF (truncated)
                more = os.read(fd, want - len(piece))
                if not more:
                    break
                piece += more
            digest.update(piece)
            pieces.append(piece)
            got += len(piece)
            if len(piece) < want:
                break
        digest.update(os.read(fd, 1))
        return PieceBlock(tuple(pieces)), digest.hexdigest()
    finally:
        os.close(fd)


def _will_need(row: tuple[str, str, int]) -> bool:
    """Start the kernel's read-ahead of a block file (the path in ``row``), without waiting."""
    fd = os.open(row[0], os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    finally:
        os.close(fd)
    return True


@contextlib.contextmanager
def _flocked(fd: int):
    """Hold the exclusive ``flock`` on ``fd`` (the directory's ``.lock``): other processes wait."""
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _hex_dirs(path: str) -> list[str]:
    try:
        with os.scandir(path) as entries:
            return [e.path for e in entries if len(e.name) == 2 and e.is_dir(follow_symlinks=False)
                    and all(c in "0123456789abcdef" for c in e.name)]
    except FileNotFoundError:  # removed meanwhile (diskcache deletes emptied subdirectories)
        return []


def _block_files(path: str):
    """Paths of the block files of the cache directory ``path``: diskcache names them
    ``<2 hex>/<2 hex>/<hex>.val`` (``diskcache.Disk.filename``). Only that layout is walked: the
    workers' own tiers are directories below the in-process one, and their blocks are theirs."""
    for top in _hex_dirs(path):
        for sub in _hex_dirs(top):
            with contextlib.suppress(FileNotFoundError), os.scandir(sub) as entries:
                yield from (e.path for e in entries if e.name.endswith(".val"))


def _close(peek: diskcache.Cache, cache: diskcache.Cache, lock_fd: int) -> None:
    peek.close()
    cache.close()
    os.close(lock_fd)


def _is_damaged(err: BaseException) -> bool:
    """True for SQLite's "file is not a database" and "database disk image is malformed": the
    index file itself is bad (not the device or its permissions, which are ``OperationalError``)."""
    return getattr(err, "sqlite_errorcode", None) in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def _is_full(err: BaseException) -> bool:
    """ENOSPC/EDQUOT, or SQLite's "database or disk is full"."""
    if isinstance(err, OSError):
        return err.errno in (errno.ENOSPC, errno.EDQUOT)
    return "full" in str(err)


class _PrivateDisk(diskcache.Disk):
    """diskcache storage that creates directories 0700 and files 0600."""

    def _write(self, full_path, iterator, mode, encoding=None):
        directory = os.path.dirname(full_path)
        if not os.path.isdir(directory):
            private.makedirs(directory)
        fd = os.open(full_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, private.FILE_MODE)
        try:
            with open(fd, mode.replace("x", "w"), encoding=encoding) as writer:
                if isinstance(iterator, io.BytesIO):  # one write: iterating a BytesIO yields "lines"
                    # getvalue() hands back the bytes the BytesIO was made from; getbuffer() would
                    # first copy them (a 4 MiB copy per block stored).
                    return writer.write(iterator.getvalue())
                size = 0
                for chunk in iterator:
                    size += len(chunk)
                    writer.write(chunk)
                return size
        except BaseException:
            # A half-written file (disk full, kill) is not in the index: nothing would ever count
            # or delete it, so it would eat the disk outside the quota.
            with contextlib.suppress(OSError):
                os.unlink(full_path)
            raise


class DiskTier:
    """Block files under ``path`` bounded by ``quota`` bytes with ``high``/``low`` watermarks.

    ``medium`` is "SSD" or "HDD" (only reported). Never raises for an unusable directory: the
    tier then starts unhealthy (see :meth:`_open`). Counters (this process only): ``evictions``, ``corrupt`` (blocks dropped for a bad
    checksum), ``full_bypasses`` (writes that met a full device), ``write_errors``; ``healthy``
    is False after a device error (see the module docstring); ``lost``: index rows dropped because their
    block file was gone or short.
    """

    def __init__(self, path: str, quota: int, high: float = 0.95, low: float = 0.7, medium: str = "SSD"):
        self.path = os.path.abspath(path)
        self.medium = medium
        self.quota = quota
        self._high = int(quota * high)
        self._low = int(quota * low)
        self._lock = threading.Lock()
        self._cache = self._peek = None  # diskcache handles; None while the directory is unusable
        self._rows: dict[str, tuple[str, str, int]] = {}  # key -> :meth:`_row` of a recent hit
        self.evictions = 0
        self.corrupt = 0
        self.lost = 0  # index rows dropped because their block file was gone or short
        self.orphans_removed = 0
        self.full_bypasses = 0
        self.write_errors = 0
        self.healthy = True
        self._damaged = False  # the last error said the index is damaged: the recheck reopens it
        self._unhealthy_since = 0.0
        self._accessed: dict[str, float] = {}  # key -> time of its last use, not yet in the index
        self._accessed_lock = threading.Lock()
        self._flushed = time.monotonic()
        self.sweeper: threading.Thread | None = None  # this open's orphan sweep; None: none was due
        # Eviction order: callable((key, size) rows in LRU order) -> rows in eviction order; None: LRU
        # (a plan sets its next-use ranking, datacache.plan.nextuse).
        self.rank_victims = None
        self._open()

    def _open(self) -> bool:
        """Open (creating it if needed) the directory and its index; True on success. A directory
        that cannot be used (read-only, not ours, on a failed device) leaves the tier unhealthy
        with a warning naming the directory and the fix: the dataset still opens and reads come
        from the UFS (a cache that cannot cache is slower, never an error). A damaged index is
        replaced by an empty one (see :meth:`_open_index`)."""
        try:
            private.makedirs(self.path)
            lock_fd = os.open(private.touch(os.path.join(self.path, ".lock")), os.O_RDWR)
        except OSError as err:
            return self._cannot_open(err)
        try:
            with _flocked(lock_fd):
                cache = self._open_index()
        except (OSError, sqlite3.Error) as err:
            os.close(lock_fd)
            return self._cannot_open(err)
        # A second handle whose reads do not update access times, for lookups that are not uses
        # of the block (read-ahead hints, short-circuit paths): only get() counts as a use.
        self._peek = diskcache.Cache(self.path, disk=_PrivateDisk)
        self._peek.reset("eviction_policy", "least-recently-stored", update=False)
        for name in _INDEX_FILES:
            with contextlib.suppress(FileNotFoundError):
                os.chmod(os.path.join(self.path, name), private.FILE_MODE)
        self._lock_fd, self._cache = lock_fd, cache
        if self._sweep_due():
            known = {f for (f,) in cache._sql("SELECT filename FROM Cache WHERE filename IS NOT NULL")}
            self.sweeper = threading.Thread(target=self._sweep_orphans, args=(known,), daemon=True,
                                            name="datacache-orphan-sweep")
            self.sweeper.start()
        if not self.healthy:
            log.warning("cache tier %s (%s) is usable again", self.path, self.medium)
            self.healthy = True
        self._damaged = False
        return True

    def _open_index(self) -> diskcache.Cache:
        """The directory's index, opened with the directory's lock held (so no put of any process
        is between writing a block file and its row). Raises ``OSError``/``sqlite3.Error`` when
        the directory cannot be used.

        A damaged index ("file is not a database", "database disk image is malformed") is
        deleted with a warning and a new one made: a tier that would refuse every open until
        someone deletes a file by hand sends all reads to the UFS for good. An index with no
        rows (new, damaged, or emptied under us) names no block file, so every block file then
        in the directory is an orphan and is deleted whatever its age (those of a damaged index
        cannot be verified without their checksums anyway), else they would sit outside the
        quota until the grace-period sweep. Deleting them is safe against another process: its
        put writes the file and then the row under the same lock, so none is half done here; and
        a row whose file is gone is a miss (see :meth:`get`), never wrong bytes."""
        cache = None
        try:
            cache = self._connect()
            empty = cache._sql("SELECT 1 FROM Cache LIMIT 1").fetchone() is None
        except sqlite3.DatabaseError as err:
            if not _is_damaged(err):
                raise
            if cache is not None:  # opened, damaged further in
                cache.close()
            for name in _INDEX_FILES:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.path, name))
            log.warning("cache tier %s (%s): its index %s was damaged (%s): deleted with the block files it "
                        "indexed (they cannot be verified without it); the tier starts empty", self.path,
                        self.medium, os.path.join(self.path, "cache.db"), err)
            cache, empty = self._connect(), True
        if empty:
            self.orphans_removed += self._delete_block_files(set(), cutoff=None)
        return cache

    def _connect(self) -> diskcache.Cache:
        return diskcache.Cache(
            self.path,
            disk=_PrivateDisk,
            eviction_policy="least-recently-used",
            size_limit=2**62,  # culling is ours (watermarks), never diskcache's own
            cull_limit=0,
            disk_min_file_size=0,
            # Keep the write-ahead log small: it counts against the quota too.
            sqlite_wal_autocheckpoint=256,
            sqlite_journal_size_limit=1 << 20,
        )

    def _cannot_open(self, err: BaseException) -> bool:
        if self.healthy:
            log.warning("cache tier %s (%s) cannot be used, reads go to the UFS uncached: %s (fix: make %s "
                        "writable by uid %d, or set the CacheRuntime's tieredstore.levels[].path to a writable "
                        "directory; tried again every %g s)", self.path, self.medium, err, self.path,
                        os.geteuid(), RECHECK_S)
        self.healthy = False
        self.write_errors += 1
        self._unhealthy_since = time.monotonic()
        return False

    @contextlib.contextmanager
    def _exclusive(self):
        with self._lock, _flocked(self._lock_fd):
            yield

    def used(self) -> int:
        """Bytes on disk under the directory: blocks, index database and its write-ahead log."""
        if self._cache is None:
            return 0
        wal = os.path.join(self.path, "cache.db-wal")
        try:
            wal_size = os.path.getsize(wal)
        except FileNotFoundError:
            wal_size = 0
        return self._cache.volume() + wal_size

    def __contains__(self, key: str) -> bool:
        """Whether the block is stored: its index row names a file of the row's size (one
        ``stat``; the checksum is not read, see :meth:`verify`). A row whose file is gone or
        short (deleted or truncated behind the cache's back) is dropped."""
        if self._peek is None:
            return False
        try:
            row = self._row(key)
        except sqlite3.Error as err:
            self._mark_unhealthy(err)
            return False
        return row is not None and self._file_whole(key, row)

    def verify(self, key: str) -> bool:
        """Whether the block is stored and its bytes pass their checksum (the whole file is read;
        ``datacache warmup --check``); a block that fails is dropped (see :meth:`get`)."""
        return self.get(key) is not None

    def present_keys(self):
        """Iterate over the keys of the blocks whose files are there at their indexed size: one
        ``stat`` per block (what status counts, cases C13/C14), rows streamed from the index. Rows
        whose file is gone or short are dropped."""
        if self._peek is None:
            return
        rows = self._peek._con.execute("SELECT key, filename, size FROM Cache WHERE raw = 1 AND filename IS NOT NULL")
        lost_before = self.lost
        for key, name, size in rows:
            if isinstance(key, str) and self._file_whole(key, (os.path.join(self.path, name), "", size)):
                yield key
        if self.lost > lost_before:
            log.warning("cache tier %s: %d block files were missing or short on disk (deleted or truncated "
                        "outside datacache): dropped from the index", self.path, self.lost - lost_before)

    def _file_whole(self, key: str, row: tuple[str, str, int]) -> bool:
        """Whether the block file of ``row`` (a :meth:`_row`) has its indexed size; if not, the
        row is dropped (only that row: a new copy stored meanwhile under ``key`` stays)."""
        try:
            if os.stat(row[0]).st_size == row[2]:
                return True
        except FileNotFoundError:
            pass
        except OSError as err:  # a failing device: a miss, the UFS serves the block
            self._mark_unhealthy(err)
            return False
        self._drop_row(key, row[0])
        return False

    def _drop_row(self, key: str, path: str) -> None:
        """Delete the index row of ``key`` if it still names the file ``path``, then the file."""
        self._rows.pop(key, None)
        if not self._usable():
            return
        with self._exclusive():
            try:
                self._cache._con.execute("DELETE FROM Cache WHERE key = ? AND raw = 1 AND filename = ?",
                                         (key, os.path.relpath(path, self.path)))
            except sqlite3.Error as err:
                self._mark_unhealthy(err)
                return
        with contextlib.suppress(OSError):
            os.unlink(path)
        self.lost += 1

    def get(self, key: str) -> bytes | None:
        """The block's bytes, or None when absent or corrupt (a corrupt or truncated block is
        deleted). Marks the block recently used (written by :meth:`flush_accesses`)."""
        return self._get(key, pieces=False)

    def get_pieces(self, key: str) -> PieceBlock | bytes | None:
        """As :meth:`get`, for a reader that hands out parts of the block: one over :data:`PIECE`
        bytes comes as a :class:`PieceBlock` (checksum verified piece by piece)."""
        return self._get(key, pieces=True)

    def _get(self, key: str, pieces: bool) -> PieceBlock | bytes | None:
        if self._cache is None:
            return None
        try:
            found = self._at_row(key, functools.partial(self._read_verified, pieces=pieces))
        except FileNotFoundError:
            # Evicted since the SELECT (its row is gone then), or the file was lost: drop the
            # row, else the refill's put would find the key and never write the file again.
            self._cache.delete(key)
            return None
        except (OSError, sqlite3.Error) as err:  # a failing device is a miss: the UFS serves it
            self._mark_unhealthy(err)
            return None
        if found is None:
            return None
        row, (data, digest) = found
        self._note_access(key)
        if digest != row[1]:
            self._rows.pop(key, None)
            self.corrupt += 1
            log.warning("cache tier %s: block %s failed its checksum: dropped, refetched", self.path, key)
            self._cache.delete(key)
            return None
        return data

    @staticmethod
    def _read_verified(row: tuple[str, str, int], pieces: bool) -> tuple[PieceBlock | bytes, str]:
        """``(the block file's bytes, their xxh3-64 hex digest)``; in pieces when asked for and
        the block is longer than one."""
        if pieces and row[2] > PIECE:
            return _read_pieces(row[0], row[2])
        data = _read_block(row[0], row[2])
        return data, checksum(data)

    def _at_row(self, key: str, use):
        """``(row, use(row))`` for the block's :meth:`_row`, or None when the index has none.

        The row is remembered once a use found its file, so the next needs no SELECT: block files
        get a new unique name on every write, so a remembered row gone stale (evicted, rewritten,
        by any process) names a file that no longer exists; it is forgotten and the index asked
        again. ``FileNotFoundError`` from a row just read from the index propagates."""
        remembered = self._rows.get(key)
        row = remembered or self._row(key)
        if row is None:
            return None
        try:
            result = use(row)
        except FileNotFoundError:
            self._rows.pop(key, None)
            if remembered is None:
                raise
            return self._at_row(key, use)
        if remembered is None:
            if len(self._rows) >= ROWS_KEPT:
                self._rows.clear()
            self._rows[key] = row
        return row, result

    def _note_access(self, key: str) -> None:
        """Remember a use of ``key`` for LRU; written with the others at most every
        ``ACCESS_FLUSH_S`` seconds (and before any eviction), not one transaction per read."""
        with self._accessed_lock:
            self._accessed[key] = time.time()
        if time.monotonic() - self._flushed >= ACCESS_FLUSH_S:
            self.flush_accesses()

    def flush_accesses(self) -> int:
        """Write the access times of the blocks used since the last call, in one transaction, to
        diskcache's LRU column (the order :meth:`_evict_to` follows; other processes sharing the
        directory see them at most ``ACCESS_FLUSH_S`` late). Returns how many blocks were marked.
        A full device cannot take them: they are dropped (the blocks are only older for LRU)."""
        with self._accessed_lock:
            accessed, self._accessed = self._accessed, {}
            self._flushed = time.monotonic()
        if accessed:
            try:
                with self._cache.transact():
                    self._cache._con.executemany("UPDATE Cache SET access_time = ? WHERE key = ? AND raw = 1",
                                                 [(t, k) for k, t in accessed.items()])
            except (OSError, sqlite3.Error) as err:
                if not _is_full(err):
                    raise
        return len(accessed)

    def _row(self, key: str) -> tuple[str, str, int] | None:
        """``(path of the block file, its xxh3 checksum, its size in bytes)`` from the index, or
        None when absent.

        One indexed SELECT, no transaction, on the handle that never writes: diskcache's own
        ``get`` costs ~25 µs more per block (and, under its LRU policy, a write transaction).
        Blocks are always files (``disk_min_file_size=0``); ``raw = 1`` is how diskcache stores
        str keys."""
        row = self._peek._con.execute(_SELECT_BLOCK, (key,)).fetchone()
        return None if row is None else (os.path.join(self.path, row[0]), row[1], row[2])

    def block_file(self, key: str) -> str | None:
        """Path of the block's file (for short-circuit reads and sendfile), or None. The file
        may be evicted right after: callers opening it handle ``FileNotFoundError``."""
        row = self._row(key) if self._peek is not None else None
        return row[0] if row is not None else None

    def advise(self, key: str) -> bool:
        """True when the block is stored; its file is then read ahead asynchronously by the kernel
        (``posix_fadvise(WILLNEED)``), so the coming ``get`` finds it in the page cache."""
        if self._peek is None:
            return False
        try:
            return self._at_row(key, _will_need) is not None
        except FileNotFoundError:  # evicted meanwhile: a miss after all
            return False

    def put(self, key: str, data: bytes | memoryview) -> bool:
        """Store a block; False when it is not kept: larger than the high watermark even in an
        empty tier, the device is full (after evicting to the low watermark and trying once
        more), or the tier is unhealthy. Never raises for a write failure: the caller still has
        the bytes, so the read is served and only caching is skipped."""
        size = len(data)
        if size > self._high or not self._usable():
            return False
        with self._exclusive():
            try:
                if key in self._cache:
                    return True
                if self.used() + size > self._high:
                    self._evict_to(self._low - size)
                self._write(key, data)
                if not self.healthy:
                    log.warning("cache tier %s (%s) takes writes again", self.path, self.medium)
                    self.healthy = True
                return True
            except (OSError, sqlite3.Error) as err:
                if _is_full(err):  # still full, or the index could not grow: skip it, stay healthy
                    self.full_bypasses += 1
                else:
                    self._mark_unhealthy(err)
                return False

    def _write(self, key: str, data: bytes | memoryview) -> None:
        try:
            self._cache.set(key, bytes(data), tag=checksum(data))
        except (OSError, sqlite3.Error) as err:
            if not _is_full(err):
                raise
            # The device filled before the quota did (a smaller disk, or one shared with others):
            # make room down to the low watermark and try once more.
            self.full_bypasses += 1
            self._evict_to(min(self._low, self.used()) - len(data))
            self._cache.set(key, bytes(data), tag=checksum(data))

    def _sweep_due(self) -> bool:
        """True when no process started a sweep of this directory in the last ``ORPHAN_GRACE_S``
        seconds (the mtime of its ``.swept`` file tells), which it then marks as started now.

        A sweep walks every block file and holds the GIL for much of it (~0.4 s for 2,000 blocks):
        run on every open, it slowed the first reads of each new client (every DataLoader worker
        process opens one) for an orphan that younger sweeps would keep anyway."""
        stamp = os.path.join(self.path, ".swept")
        try:
            with contextlib.suppress(FileNotFoundError):
                if time.time() - os.stat(stamp).st_mtime < ORPHAN_GRACE_S:
                    return False
            os.utime(private.touch(stamp))
        except OSError:  # a directory we cannot write to: its files cannot be deleted either
            return False
        return True

    def _sweep_orphans(self, known: set[str]) -> None:
        """Delete block files that no index row names (``known``: the indexed file names).

        A process killed while storing a block leaves its file (written before its row) behind;
        nothing would ever count or delete it, so crashes would grow the directory past the quota.
        Files younger than ``ORPHAN_GRACE_S`` may be another process's write in flight: kept.
        Runs in a thread at start-up, touching only the file system."""
        self.orphans_removed += self._delete_block_files(known, cutoff=time.time() - ORPHAN_GRACE_S)

    def _delete_block_files(self, known: set[str], cutoff: float | None) -> int:
        """Delete the block files of the directory not in ``known`` (paths relative to it) and,
        unless ``cutoff`` is None, last modified before ``cutoff`` (seconds since the epoch).
        Returns how many."""
        removed = 0
        for full in _block_files(self.path):
            if os.path.relpath(full, self.path) in known:
                continue
            with contextlib.suppress(FileNotFoundError):
                if cutoff is None or os.stat(full).st_mtime < cutoff:
                    os.unlink(full)
                    removed += 1
        return removed

    def _usable(self) -> bool:
        """False while unhealthy; an unhealthy tier is tried again after ``RECHECK_S`` seconds
        (a directory that could not be opened is opened again then)."""
        if self.healthy:
            return True
        if time.monotonic() - self._unhealthy_since <= RECHECK_S:
            return False
        with self._lock:  # one thread reopens
            if self._cache is None:
                return self._open()
            if not self._damaged:
                return True
            # Damaged while open: open (so replace) it anew, then close the old handles (a read
            # still using one gets an error, so a miss).
            old = self._peek, self._cache, self._lock_fd
            if not self._open():
                self._cache = self._peek = None
            _close(*old)
            return self._cache is not None

    def _mark_unhealthy(self, err: BaseException) -> None:
        if self.healthy:
            log.warning("cache tier %s (%s) is unhealthy, reads go to the UFS: %s", self.path, self.medium, err)
        self.healthy = False
        self._damaged = _is_damaged(err)
        self.write_errors += 1
        self._unhealthy_since = time.monotonic()

    def _evict_to(self, target: int) -> None:
        """Delete least recently used blocks, one at a time, until ``used() <= target``.

        Not ``diskcache.Cache.cull``: it deletes 10 rows per round, so with large blocks it went
        far below the low watermark (up to 9 blocks too many) and threw away cached data."""
        self.flush_accesses()  # this process's recent uses count
        excess = self.used() - target
        if excess <= 0:
            return
        doomed, freed = [], 0
        # diskcache's LRU order: the access_time column its least-recently-used policy keeps.
        rows = self._cache._sql("SELECT key, size FROM Cache ORDER BY access_time")
        for key, size in rows if self.rank_victims is None else self.rank_victims(rows):
            if freed >= excess:
                break
            doomed.append(key)
            freed += size
        for key in doomed:
            if self._cache.delete(key):
                self.evictions += 1

    def delete_prefix(self, prefix: str) -> int:
        """Delete every block whose key starts with ``prefix``; returns how many."""
        if self._cache is None:
            return 0
        doomed = [k for k in self._cache.iterkeys() if isinstance(k, str) and k.startswith(prefix)]
        for k in doomed:
            self._cache.delete(k)
        return len(doomed)

    def prefix_bytes(self, prefix: str) -> int:
        """Bytes of the stored blocks whose keys start with ``prefix`` (e.g. one dataset's
        ``name/``): one SQL sum over the index's key range, no row read into Python."""
        if self._cache is None or not prefix:
            return 0
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)  # the first key past every key with the prefix
        ((total,),) = self._cache._sql("SELECT COALESCE(SUM(size), 0) FROM Cache WHERE raw = 1 AND key >= ? AND key < ?",
                                       (prefix, end)).fetchall()
        return int(total)

    def keys(self):
        """Iterate over stored block keys."""
        if self._cache is None:
            return iter(())
        return (k for k in self._cache.iterkeys() if isinstance(k, str))

    def close(self) -> None:
        if self._cache is None:
            return
        with contextlib.suppress(OSError, sqlite3.Error):  # a failing device loses only LRU order
            self.flush_accesses()
        _close(self._peek, self._cache, self._lock_fd)
        self._cache = self._peek = None
