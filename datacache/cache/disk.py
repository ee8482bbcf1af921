"""SSD/HDD tier: one sparse cache file per file version under one cache directory, indexed in SQLite.

Layout (issue 17 item 4):
- ``files/<token>``: the cache file of one file version (the ``dataset/file_id`` part of its
  block keys, :class:`~datacache.cache.blocks.BlockKey`), named by a random token given when its
  first block is stored, never by a user path. Block ``i`` sits at ``i * stride`` (``stride``: the
  tier's block size, fixed per file when the file is made), written with ``pwrite``; blocks not
  stored are holes, so a file filling in any order takes only the space of its blocks. A version
  whose blocks are all stored is one contiguous file with the bytes of the whole version: FUSE
  passes it through to the kernel and ``datacache://`` opens it as a plain file
  (:meth:`DiskTier.open_whole`), with no second copy.
- ``index.db``: SQLite (WAL), one row per file (token, stride, ``exposed``: handed out whole, and
  checked in the boot whose :func:`boot_mark` it holds; ``handed``: the identity of the cache file
  that check saw, :func:`_identity`, so other processes open it with no query, see
  :meth:`DiskTier._learn_handed`) and
  one row per block (size, xxh3-64 checksum, last access). Rows per block, not a bitmap per file:
  eviction is least recently used per block (a file larger than the quota, case C1, keeps its
  recent blocks), a store is one INSERT (a bitmap would be read, edited and rewritten under the
  lock), and status sums sizes in SQL. A ``totals`` row kept by triggers holds the bytes stored, so
  a put needs no sum over the index.
- Directories 0700, files 0600: a second local user can read no cached data (case C10).

Quota and watermarks (cases C1, C2): the quota counts the blocks' bytes plus the index and its WAL.
A put reserves its block's row under an exclusive lock (a thread lock plus ``flock`` on
``.lock`` for other processes sharing the directory), evicting from the high to the low watermark
when the new block would pass the high mark; a reserved row (empty checksum) counts against the
quota and may be evicted like any other (its put then stores nothing), but no reader sees it. The
bytes are then written without the lock (many puts at once), and the row completed under it. So
the quota holds while many fills run at once, across processes, counting the blocks being
written. :meth:`DiskTier._eviction_order` is the one place that ranks what goes first (least
recently used block).

Eviction never changes bytes under a reader of a whole file: a file once handed out whole
(``exposed``) is evicted whole, by ``unlink``; a reader holding it open (a passthrough backing file,
an ``mmap``) keeps reading its complete bytes and the device frees them at its last close. Inside a
file never handed out, single blocks are evicted by punching a hole (``fallocate`` PUNCH_HOLE); a
block reader racing with that reads zeros, which its checksum rejects (a miss, never wrong bytes).
Where the file system cannot punch holes, the whole file goes.

Integrity: every block read through :meth:`DiskTier.get` is checked against its xxh3-64; a corrupt
block is dropped and reported as a miss, so the caller refetches it. A whole file is checked block
by block the first time a process hands it out after the machine booted (:meth:`DiskTier.open_whole`;
the processes of one boot share the check: each DataLoader worker process and each new run
used to read every file twice, the first open of a 256 MiB file taking 40 ms, 0.3 ms once trusted;
a power loss is a new boot, so what the kernel had not written is found) and by
:meth:`DiskTier.verify` (``datacache verify``, ``warmup --check``); reads through a handed-out file (kernel
passthrough, a plain file object) are not checked again (JuiceFS's ``--verify-cache-checksum``
makes the same trade-off).

Access times: a hit writes nothing to the index (a write transaction per read cost more than the
read): uses are kept in memory and written once per ``ACCESS_FLUSH_S`` seconds, a block's at most
once per ``ACCESS_GRANULARITY_S`` (as ``relatime`` does for files), and all before every eviction.

Crashes and damage:
- A block's row is reserved before its bytes are written and completed (its checksum) after. A
  process killed in between leaves reserved rows, dropped with their ranges when a tier opens the
  directory once they are older than ``ORPHAN_GRACE_S``, and cache files no row names (a failed
  first write), deleted by a sweep when a tier opens the directory once as old (one sweep per
  directory per ``ORPHAN_GRACE_S``). An index with no rows (new, or emptied under us) names no
  file: every cache file then found is deleted at open, whatever its age, so the quota counts all
  that is there. The previous layout (diskcache's ``cache.db`` and one
  ``.val`` file per block) is deleted when found.
- A block whose file is gone or shorter than the block's end (deleted or truncated behind the
  cache's back) is dropped when found: by a read, by a presence check (``in``: one ``stat``, what
  warmup skips by) and by :meth:`DiskTier.present_keys` (what status counts) (issue 18).
- A damaged index ("file is not a database", "database disk image is malformed") is deleted with a
  warning naming the directory, with the files it indexed; the tier starts again empty.
- A failing device never fails a read. A device that fills before the quota (ENOSPC, SQLite "disk
  is full") evicts to the low watermark and tries once more, else skips caching that block; at
  0 bytes free, where the index cannot record an eviction, the cache file goes first and its
  rows after (a tier that waited for the index stayed full for good: 1 btrfs fill in 12); any
  other write or index error marks the tier unhealthy: it then caches nothing and reports misses,
  and is tried again after ``RECHECK_S`` seconds. A directory that cannot be opened at start-up
  starts the tier unhealthy the same way, with a warning naming the directory and the fix.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import logging
import os
import sqlite3
import threading
import time
import uuid

from datacache import private
from datacache.errors import ConfigError
from datacache.cache.blocks import PIECE, PieceBlock, checksum
from datacache.cache.boot import boot_mark
from datacache.cache.extents import (commit_frees, copy_on_write, digest_range, punch_hole, read_pieces, read_range,
                                     will_need, write_range)
from datacache.cache.openfiles import OpenFiles

log = logging.getLogger(__name__)
RECHECK_S = 30.0  # seconds an unhealthy tier is left alone before a write is tried again
ORPHAN_GRACE_S = 600.0  # an unindexed cache file older than this is a crash's leftover
ACCESS_FLUSH_S = 1.0  # seconds between two writes of the blocks' access times to the index
ACCESS_GRANULARITY_S = 30.0  # seconds: a block's access time is rewritten at most so often between evictions
HANDED_KEPT = 65536  # files handed out whole whose cache file name is remembered (~23 MiB; ImageNet has 1.28M)
LEARN_HANDED_AFTER = 32  # a power of 2: open_whole queries after which (and 2x, 4x...) a process learns hand-outs
WRITTEN_KEPT = 65536  # blocks whose last written access time is remembered (~9 MiB)
ROWS_KEPT = 16384  # index rows of recent hits kept in memory: a hit without a SELECT
BLOCK_SIZE = 4 << 20  # default block size (bytes): the stride of a file's blocks
FREE_SPACE_RATIO = 0.1
"""Default fraction of the cache device a put leaves free (JuiceFS's ``--free-space-ratio``,
default 0.1; a level's ``freeSpaceRatio`` or :data:`FREE_SPACE_ENV` sets another): the tier evicts
to keep it, and skips the block when its own blocks cannot make the room (other files filled the
device). A full device fails more than a write: the index's WAL index (``index.db-shm``) is a
shared mapping, and a page of it that the file system cannot allocate (btrfs copy-on-write on a
full device) is a SIGBUS in SQLite."""
FREE_SPACE_ENV = "DATACACHE_FREE_SPACE_RATIO"  # the node's default for levels that do not say
ROOM_LAG_S = 30.0
"""Seconds after an eviction for :data:`FREE_SPACE_RATIO` that did not show in ``statvfs``
during which a put that finds the device short is skipped, not met with more eviction: btrfs
frees the space of punched and unlinked extents at its next transaction commit (mount option
``commit``, 30 s by default), and until then ``statvfs`` shows the device as full as before;
evicting on every put drained a 200 MiB btrfs tier to 13 MiB in 10 s. So after such an
eviction the tier first asks the file system to commit (:func:`~datacache.cache.extents.commit_frees`,
2.6 ms on an idle btrfs; 16 threads filling a 200 MiB btrfs then keep 18-26 of the ~40 blocks
that fit, 0-25 before); the lag is for a file system that cannot."""
FILES = "files"  # subdirectory of the cache files
INDEX = "index.db"  # the index of a cache directory: where it is, a disk tier has used the directory
_INDEX_FILES = (INDEX, INDEX + "-wal", INDEX + "-shm", INDEX + "-journal")
_OLD_INDEX_FILES = ("cache.db", "cache.db-wal", "cache.db-shm")  # the block-file layout's diskcache index
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS files (file TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, "
    "stride INTEGER NOT NULL, exposed INTEGER NOT NULL DEFAULT 0, handed TEXT)",
    "CREATE TABLE IF NOT EXISTS blocks (file TEXT NOT NULL, idx INTEGER NOT NULL, size INTEGER NOT NULL, "
    "digest TEXT NOT NULL, atime REAL NOT NULL, PRIMARY KEY (file, idx)) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS blocks_atime ON blocks (atime)",
    "CREATE INDEX IF NOT EXISTS blocks_pending ON blocks (atime) WHERE digest = ''",  # reserved rows only
    "CREATE TABLE IF NOT EXISTS totals (bytes INTEGER NOT NULL)",
    "INSERT INTO totals SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM totals)",
    "CREATE TRIGGER IF NOT EXISTS blocks_in AFTER INSERT ON blocks BEGIN "
    "UPDATE totals SET bytes = bytes + NEW.size; END",
    "CREATE TRIGGER IF NOT EXISTS blocks_out AFTER DELETE ON blocks BEGIN "
    "UPDATE totals SET bytes = bytes - OLD.size; END",
)
# The checksum of a block row reserved by a put whose bytes are being written. SQL spells it as
# the literal '' (readers filter with digest != ''): the partial index blocks_pending is only
# used by queries that name the same literal, not a bound parameter.
_PENDING = ""
_KEY = "(CASE WHEN idx < 0 THEN file ELSE file || '/' || idx END)"  # join_key() in SQL
_SELECT_BLOCK = ("SELECT f.name, f.stride, b.size, b.digest FROM blocks b JOIN files f ON f.file = b.file "
                 "WHERE b.file = ? AND b.idx = ? AND b.digest != ''")


def split_key(key: str) -> tuple[str, int]:
    """``(file, index)`` of a block key ``<file>/<index>`` (``str(BlockKey)``: the file is
    ``dataset/file_id``); a key not ending in a block index is a file of one block, ``(key, -1)``
    (stored at offset 0; :func:`join_key` gives the key back)."""
    file, _, index = key.rpartition("/")
    if not file or not index.isdigit():
        return key, -1
    return file, int(index)


def join_key(file: str, index: int) -> str:
    """The block key of block ``index`` of ``file`` (inverse of :func:`split_key`)."""
    return file if index < 0 else f"{file}/{index}"


def default_free_space_ratio() -> float:
    """The fraction of a cache device puts leave free when the level does not say: the
    environment's :data:`FREE_SPACE_ENV`, else :data:`FREE_SPACE_RATIO`. Raises ConfigError when
    the variable is not a number in [0, 1)."""
    value = os.environ.get(FREE_SPACE_ENV)
    if value is None:
        return FREE_SPACE_RATIO
    try:
        ratio = float(value)
    except ValueError:
        ratio = -1.0
    if not 0 <= ratio < 1:
        raise ConfigError(FREE_SPACE_ENV, [("", f"{value!r} is not a fraction of the cache device in [0, 1): "
                                                f"set it like 0.05, or unset it for {FREE_SPACE_RATIO}")])
    return ratio


def holds_cache(directory: str) -> bool:
    """Whether ``directory`` is a disk tier's cache directory (its index is there)."""
    return os.path.exists(os.path.join(directory, INDEX))


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
    except FileNotFoundError:
        return []


def _drop_old_layout(path: str) -> int:
    """Delete the block-file layout's index and block files (``<2 hex>/<2 hex>/<hex>.val``, as
    diskcache named them) from the cache directory ``path``; returns how many block files. Only
    that layout is walked: the workers' own tiers are directories below, and theirs."""
    if not os.path.exists(os.path.join(path, _OLD_INDEX_FILES[0])):
        return 0
    removed = 0
    for top in _hex_dirs(path):
        for sub in _hex_dirs(top):
            with contextlib.suppress(FileNotFoundError), os.scandir(sub) as entries:
                for e in entries:
                    if e.name.endswith(".val"):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(e.path)
                            removed += 1
            with contextlib.suppress(OSError):
                os.rmdir(sub)
        with contextlib.suppress(OSError):
            os.rmdir(top)
    for name in _OLD_INDEX_FILES:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(path, name))
    log.info("cache tier %s: deleted %d block files of the previous layout (one file per block)", path, removed)
    return removed


def _is_damaged(err: BaseException) -> bool:
    """True for SQLite's "file is not a database" and "database disk image is malformed": the
    index file itself is bad (not the device or its permissions, which are ``OperationalError``)."""
    return getattr(err, "sqlite_errorcode", None) in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


DEVICE_FULL = ("the cache device is full or short of its free-space reserve (before the quota): free space on "
               "it, or lower tieredstore.levels[].quota or tieredstore.levels[].freeSpaceRatio")
"""Why a block was not cached, or a tier not opened, on a device that filled before the quota."""


def _is_full(err: BaseException) -> bool:
    """ENOSPC/EDQUOT, or SQLite's "database or disk is full"."""
    if isinstance(err, OSError):
        return err.errno in (errno.ENOSPC, errno.EDQUOT)
    return "full" in str(err)


class DiskTier:
    """Blocks under ``path`` bounded by ``quota`` bytes with ``high``/``low`` watermarks (fractions
    of the quota), one cache file per file version (see the module docstring).

    ``medium`` is "SSD" or "HDD" (only reported); ``block_size``: bytes between two blocks' offsets
    in a file made from now on (a block longer than its file's stride is not kept);
    ``free_space_ratio``: the fraction of the device a put leaves free (None:
    :func:`default_free_space_ratio`). Raises ConfigError for a bad :data:`FREE_SPACE_ENV`; never
    raises for an unusable directory: the tier then starts unhealthy (see :meth:`_open`). Counters (this
    process only): ``evictions`` (blocks), ``corrupt`` (blocks dropped for a bad checksum),
    ``full_bypasses`` (writes that met a full device), ``write_errors``, ``lost`` (blocks dropped
    because their file was gone or short), ``orphans_removed`` (unindexed cache files deleted);
    ``healthy`` is False after a device error.
    """

    def __init__(self, path: str, quota: int, high: float = 0.95, low: float = 0.7, medium: str = "SSD",
                 block_size: int = BLOCK_SIZE, free_space_ratio: float | None = None):
        self.path = os.path.abspath(path)
        self.free_space_ratio = default_free_space_ratio() if free_space_ratio is None else free_space_ratio
        self.files = os.path.join(self.path, FILES)
        self.medium = medium
        self.quota = quota
        self.block_size = block_size
        self._high = int(quota * high)
        self._low = int(quota * low)
        self._lock = threading.RLock()  # orders this process's index writes (one connection)
        self._db = self._ro = None  # index connections (writes; per-thread lookups); None while unusable
        self._rows: dict[str, tuple[str, int, int, str]] = {}  # key -> :meth:`_row` of a recent hit
        self._handed: dict[str, tuple[str, int, str]] = {}  # file -> (name, size, _identity) open_whole checked
        self._handed_queries = 0  # open_whole queries of files not in _handed (see LEARN_HANDED_AFTER)
        self._open_files = OpenFiles()  # small cache files kept open between block reads
        self.evictions = 0
        self.corrupt = 0
        self.lost = 0
        self.orphans_removed = 0
        self.full_bypasses = 0
        self.commits = 0  # file system commits asked for so that an eviction's frees show
        self.emergency_unlinks = 0  # cache files removed before the index could record it (a full device)
        self._made_room_at = -ROOM_LAG_S  # time.monotonic() of the last eviction for room that did not show
        self._writing = 0  # bytes of the blocks this instance's puts reserved whose space is not allocated yet
        self._writing_lock = threading.Lock()  # not the tier's lock: a write must not wait for an eviction
        self.write_errors = 0
        self.healthy = True
        self.last_error = ""  # why the tier is unhealthy, with the fix ('' while healthy)
        self.direct_io = True  # bulk puts write with O_DIRECT until the file system refuses it
        self._damaged = False  # the last error said the index is damaged: the recheck reopens it
        self._unhealthy_since = 0.0
        self._accessed: dict[str, float] = {}  # key -> time of its last use, not yet in the index
        self._written: dict[str, float] = {}  # key -> the last access time this process wrote for it
        self._accessed_lock = threading.Lock()
        self._flushed = time.monotonic()
        self.sweeper: threading.Thread | None = None  # this open's orphan sweep; None: none was due
        # Eviction order: callable(rows ``(file, index, size, exposed)`` in LRU order) -> the rows in
        # eviction order; None: LRU (a plan sets its next-use ranking, datacache.plan.nextuse).
        self.rank_victims = None
        self._open()

    # -- opening -----------------------------------------------------------------------------------

    def _open(self) -> bool:
        """Open (creating it if needed) the directory and its index; True on success. A directory
        that cannot be used (read-only, not ours, on a failed device) leaves the tier unhealthy
        with a warning naming the directory and the fix: reads then come from the UFS. A damaged
        index is replaced by an empty one (see :meth:`_open_index`)."""
        try:
            private.makedirs(self.files)
            # The index is made in place on btrfs (not the cache files: btrfs frees a punched range
            # only with its whole extent, and NOCOW extents were kept whole: a 200 MiB device held
            # 117 MiB of extents for 20 MiB of blocks; files/ would inherit the attribute from a
            # tier directory it is nested in).
            copy_on_write(self.path, False)
            copy_on_write(self.files, True)
            lock_fd = os.open(private.touch(os.path.join(self.path, ".lock")), os.O_RDWR | os.O_CLOEXEC)
        except OSError as err:
            return self._cannot_open(err)
        try:
            with _flocked(lock_fd):
                db = self._open_index()
                ro = _Readers(os.path.join(self.path, INDEX))
        except (OSError, sqlite3.Error) as err:
            os.close(lock_fd)
            return self._cannot_open(err)
        self._lock_fd, self._db, self._ro = lock_fd, db, ro
        with contextlib.suppress(OSError, sqlite3.Error):  # a failing device: the next open tries again
            self._drop_stale_reservations(time.time() - ORPHAN_GRACE_S)
        if self._sweep_due():
            known = {name for (name,) in db.execute("SELECT name FROM files")}
            self.sweeper = threading.Thread(target=self._sweep_orphans, args=(known,), daemon=True,
                                            name="datacache-orphan-sweep")
            self.sweeper.start()
        if not self.healthy:
            log.warning("cache tier %s (%s) is usable again", self.path, self.medium)
            self.healthy, self.last_error = True, ""
        self._damaged = False
        return True

    def _open_index(self) -> sqlite3.Connection:
        """The directory's index, opened with the directory's lock held (no put of any process is
        between writing a block and its row). Raises ``OSError``/``sqlite3.Error`` when the
        directory cannot be used.

        A damaged index is deleted with a warning and a new one made: a tier that refused every
        open until someone deletes a file by hand would send all reads to the UFS for good. An
        index with no rows (new, damaged, or emptied under us) names no cache file, so every cache
        file then found is an orphan and is deleted whatever its age (those of a damaged index
        cannot be verified without their checksums anyway)."""
        _drop_old_layout(self.path)
        db = None
        try:
            db = self._connect()
            empty = _first(db.execute("SELECT 1 FROM files LIMIT 1")) is None
        except sqlite3.DatabaseError as err:
            if not _is_damaged(err):
                raise
            if db is not None:
                db.close()
            for name in _INDEX_FILES:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.path, name))
            log.warning("cache tier %s (%s): its index %s was damaged (%s): deleted with the cache files it "
                        "indexed (they cannot be verified without it); the tier starts empty", self.path,
                        self.medium, os.path.join(self.path, INDEX), err)
            db, empty = self._connect(), True
        if empty:
            self.orphans_removed += self._delete_cache_files(set(), cutoff=None)
        return db

    def _connect(self) -> sqlite3.Connection:
        """A connection to the index, created if missing (0600). Raises ``sqlite3.DatabaseError``
        when it is damaged, ``sqlite3.OperationalError``/``OSError`` when it cannot be used."""
        db = sqlite3.connect(os.path.join(self.path, INDEX), timeout=60, isolation_level=None,
                             check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # a cache refills from its source: no fsync per put
            # Keep the write-ahead log small: it counts against the quota too.
            db.execute("PRAGMA wal_autocheckpoint=256")
            db.execute("PRAGMA journal_size_limit=1048576")
            for statement in _SCHEMA:
                db.execute(statement)
            _add_handed(db)
            for name in _INDEX_FILES:
                with contextlib.suppress(FileNotFoundError):
                    os.chmod(os.path.join(self.path, name), private.FILE_MODE)
        except BaseException:
            db.close()
            raise
        return db

    def _cannot_open(self, err: BaseException) -> bool:
        full = _is_full(err) or self._device_full()  # SQLite says "disk I/O error" then
        fix = "set the CacheRuntime's tieredstore.levels[].path to a writable directory"
        code = getattr(err, "errno", None)
        if code in (errno.EACCES, errno.EPERM, None):  # None: SQLite's own errors (no errno)
            fix = f"make {self.path} writable by uid {os.geteuid()}, or {fix}"
        elif code == errno.EROFS:
            fix = f"remount the file system of {self.path} read-write, or {fix}"
        self.last_error = f"cannot be opened: {DEVICE_FULL}" if full else f"cannot be opened: {err}: {fix}"
        if self.healthy:
            log.warning("cache tier %s (%s) cannot be used, reads go to the UFS uncached: %s (%stried again every "
                        "%g s)", self.path, self.medium, DEVICE_FULL if full else err, "" if full else f"fix: {fix}; ",
                        RECHECK_S)
        self.healthy = False
        self.write_errors += 1
        self._unhealthy_since = time.monotonic()
        return False

    @contextlib.contextmanager
    def _exclusive(self):
        with self._lock, _flocked(self._lock_fd):
            yield

    # -- counting ----------------------------------------------------------------------------------

    def used(self) -> int:
        """Bytes counted against the quota: the stored blocks, the index database and its WAL."""
        if self._ro is None:
            return 0
        (stored,) = _first(self._ro.execute("SELECT bytes FROM totals"))
        index = 0
        for name in _INDEX_FILES:
            with contextlib.suppress(FileNotFoundError):
                index += os.stat(os.path.join(self.path, name)).st_size
        return stored + index

    def capacity(self) -> int:
        """Bytes this tier can hold: its quota, or less when its device cannot give that much,
        :meth:`used` plus the device's free bytes above the free-space reserve that puts leave
        (:attr:`free_space_ratio` of the device, ``statvfs``; see :meth:`_shortfall`). The quota
        when the device cannot be asked or reports no size (ramfs)."""
        try:
            st = os.statvfs(self.path)
        except OSError:
            return self.quota
        if st.f_blocks == 0:
            return self.quota
        return min(self.quota, self.used() + max(0, self._room(st)))

    def _room(self, st: os.statvfs_result) -> int:
        """Bytes free on the device of ``st`` (the tier's ``statvfs``) above the free-space
        reserve, :attr:`free_space_ratio` of the device; negative when the reserve is eaten into."""
        return st.f_bavail * st.f_frsize - int(self.free_space_ratio * st.f_blocks * st.f_frsize)

    def _row(self, key: str) -> tuple[str, int, int, str] | None:
        """``(path of the cache file, the block's offset in it, its size in bytes, its xxh3
        checksum)`` from the index, or None when absent: one indexed SELECT, no transaction."""
        file, index = split_key(key)
        row = _first(self._ro.execute(_SELECT_BLOCK, (file, index)))
        if row is None:
            return None
        name, stride, size, digest = row
        return os.path.join(self.files, name), max(index, 0) * stride, size, digest

    def __contains__(self, key: str) -> bool:
        """Whether the block is stored: its index row names a file reaching the block's end (one
        ``stat``; the checksum is not read, see :meth:`verify`). A block whose file is gone or
        short (deleted or truncated behind the cache's back) is dropped."""
        if self._ro is None:
            return False
        try:
            row = self._row(key)
        except sqlite3.Error as err:
            self._mark_unhealthy(err)
            return False
        return row is not None and self._file_whole(key, row)

    def _file_whole(self, key: str, row: tuple[str, int, int, str]) -> bool:
        """Whether the cache file of ``row`` (a :meth:`_row`) reaches the block's end; if not,
        the block is dropped (when its row still names that file)."""
        try:
            if os.stat(row[0]).st_size >= row[1] + row[2]:
                return True
        except FileNotFoundError:
            pass
        except OSError as err:  # a failing device: a miss, the UFS serves the block
            self._mark_unhealthy(err)
            return False
        self._drop(key, row[0], lost=True)
        return False

    def present_keys(self):
        """Iterate over the keys of the blocks whose files reach their end: one ``stat`` per cache
        file (what status counts, cases C13/C14). Blocks whose file is gone or short are dropped."""
        if self._ro is None:
            return
        rows = self._scan("SELECT b.file, b.idx, b.size, f.name, f.stride FROM blocks b "
                          "JOIN files f ON f.file = b.file WHERE b.digest != '' ORDER BY b.file")
        sizes: dict[str, int] = {}
        lost_before = self.lost
        for file, index, size, name, stride in rows:
            path = os.path.join(self.files, name)
            if path not in sizes:
                sizes.clear()  # rows come ordered by file: one stat per cache file
                try:
                    sizes[path] = os.stat(path).st_size
                except FileNotFoundError:
                    sizes[path] = -1
            key = join_key(file, index)
            if sizes[path] >= max(index, 0) * stride + size:
                yield key
            else:
                self._drop(key, path, lost=True)
        if self.lost > lost_before:
            log.warning("cache tier %s: %d blocks were missing or short on disk (cache files deleted or "
                        "truncated outside datacache): dropped from the index", self.path, self.lost - lost_before)

    def keys(self):
        """Iterate over stored block keys."""
        if self._ro is None:
            return iter(())
        rows = self._scan("SELECT file, idx FROM blocks WHERE digest != ''")
        return (join_key(file, index) for file, index in rows)

    def _scan(self, sql: str):
        """Rows of ``sql`` streamed in batches over a connection of their own: a statement left
        open on the shared one would hold its read snapshot for every thread using it."""
        con = sqlite3.connect(os.path.join(self.path, INDEX), timeout=60, isolation_level=None)
        try:
            cursor = con.execute(sql)
            while batch := cursor.fetchmany(1024):
                yield from batch
        finally:
            con.close()

    def prefix_bytes(self, prefix: str) -> int:
        """Bytes of the stored blocks whose keys start with ``prefix`` (e.g. one dataset's
        ``name/``): one SQL sum, no row read into Python."""
        if self._ro is None or not prefix:
            return 0
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)  # the first key past every key with the prefix
        ((total,),) = self._ro.execute(f"SELECT COALESCE(SUM(size), 0) FROM blocks WHERE digest != '' AND "
                                       f"{_KEY} >= ? AND {_KEY} < ?", (prefix, end)).fetchall()
        return int(total)

    # -- reading -----------------------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        """The block's bytes, or None when absent or corrupt (a corrupt or lost block is dropped).
        Marks the block recently used (written by :meth:`flush_accesses`)."""
        return self._get(key, pieces=False)

    def get_pieces(self, key: str) -> PieceBlock | bytes | None:
        """As :meth:`get`, for a reader that hands out parts of the block: one over :data:`PIECE`
        bytes comes as a :class:`PieceBlock` (checksum verified piece by piece)."""
        return self._get(key, pieces=True)

    def _get(self, key: str, pieces: bool, again: bool = True) -> PieceBlock | bytes | None:
        if self._ro is None:
            return None
        try:
            found = self._at_row(key, functools.partial(_read_verified, self._open_files, pieces=pieces))
        except FileNotFoundError as err:
            # Evicted since the SELECT, or the file was lost: drop the block if its row still
            # names that file, else the refill's put would find the row and never write again.
            self._drop(key, err.filename, lost=False)
            return None
        except (OSError, sqlite3.Error) as err:  # a failing device is a miss: the UFS serves it
            self._mark_unhealthy(err)
            return None
        if found is None:
            return None
        row, (data, digest) = found
        if digest != row[3]:
            self._rows.pop(key, None)
            fresh = self._row(key)
            if fresh != row:  # evicted (a hole read as zeros) or stored anew meanwhile: not damage
                return self._get(key, pieces, again=False) if again and fresh is not None else None
            self.corrupt += 1
            log.warning("cache tier %s: block %s failed its checksum: dropped, refetched", self.path, key)
            self._drop(key, row[0], lost=False)
            return None
        self._note_access(key)
        return data

    def _at_row(self, key: str, use):
        """``(row, use(row))`` for the block's :meth:`_row`, or None when the index has none.

        The row is remembered once a use found its file, so the next needs no SELECT: a cache file
        gets a new name whenever it is made anew, so a remembered row gone stale names a file that
        no longer exists (``FileNotFoundError``: forgotten, the index asked again) or a hole (its
        checksum fails: the caller asks the index again). ``FileNotFoundError`` from a row just
        read from the index propagates."""
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

    def verify(self, key: str) -> bool:
        """Whether the block is stored and its bytes pass their checksum (the block is read;
        ``datacache verify``, ``warmup --check``); a block that fails is dropped (see :meth:`get`)."""
        return self.get(key) is not None

    def block_file(self, key: str) -> str | None:
        """Path of the cache file holding the block, or None. The file may be evicted right after:
        callers opening it handle ``FileNotFoundError``."""
        extent = self.block_extent(key)
        return extent[0] if extent is not None else None

    def block_extent(self, key: str) -> tuple[str, int, int, str] | None:
        """``(path of the cache file, offset, size in bytes, xxh3 checksum)`` of a stored block (for
        short-circuit reads and ``sendfile``), or None."""
        if self._ro is None:
            return None
        return self._rows.get(key) or self._row(key)

    def advise(self, key: str) -> bool:
        """True when the block is stored; its range is then read ahead asynchronously by the kernel
        (``posix_fadvise(WILLNEED)``), so the coming ``get`` finds it in the page cache."""
        if self._ro is None:
            return False
        try:
            return self._at_row(key, lambda row: will_need(row[0], row[1], row[2])) is not None
        except FileNotFoundError:  # evicted meanwhile: a miss after all
            return False

    def open_whole(self, file: str, size: int, blocks: int) -> int | None:
        """A read-only descriptor of the cache file of ``file`` (``dataset/file_id``) when all its
        ``blocks`` blocks are stored and hold ``size`` bytes in all, else None. The caller owns and
        closes it; the file is then one contiguous copy of the whole version.

        The first time a process hands a file out after the machine booted, every block of it is
        read and checked against its checksum (a failing one is dropped, and the answer is None:
        the caller reads through the blocks, which refetch it). The file is marked handed out
        (``exposed``, holding the boot's :func:`boot_mark`, so that other processes of this boot
        skip the check) in the index: from then on it is only ever evicted whole, by ``unlink``,
        so what a reader holding the descriptor reads never changes, and this instance's later
        hand-outs of it are an ``open`` of the name it remembers, without a query (a small-file
        epoch through ``datacache://`` opens each file so); a process that does not remember it
        (:meth:`_learn_handed`) asks for the file's row alone (:meth:`_handed_row`). Each such
        ``open`` is checked against the identity the check saw (:meth:`_reopen`). Marks its blocks
        recently used."""
        if self._ro is None or blocks <= 0:
            return None
        handed = self._handed.get(file)
        known = handed is not None
        if not known:
            self._handed_queries += 1
            queries = self._handed_queries
            if queries >= LEARN_HANDED_AFTER and queries & (queries - 1) == 0:  # 32, 64, 128, ... (a power of 2)
                self._learn_handed()
                handed = self._handed.get(file)
            if handed is None:
                handed = self._handed_row(file)
        if handed is not None and handed[1] == size:  # complete until unlinked whole: no query of its blocks
            fd = self._reopen(file, handed)
            if fd is not None:
                if not known:
                    self._keep_handed(file, handed)
                self._note_accesses(file, blocks)
                return fd
        rows = self._ro.execute("SELECT f.name, f.exposed, f.handed, b.idx, b.size, b.digest, f.stride FROM files f "
                                "JOIN blocks b ON b.file = f.file AND b.digest != '' WHERE f.file = ? ORDER BY b.idx",
                                (file,)).fetchall()
        if len(rows) != blocks or sum(r[4] for r in rows) != size:
            return None
        name, exposed, handed = rows[0][:3]
        path = os.path.join(self.files, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:  # evicted since the SELECT
            return None
        boot = boot_mark()
        try:
            st = os.fstat(fd)
            seen = _identity(st)
            # a process checked this very file since the machine booted (not one changed behind the cache since)
            checked = exposed == boot and handed == seen
            if st.st_size != size or not (checked or self._check_whole(file, fd, path, [r[3:] for r in rows])):
                os.close(fd)
                return None
            marked = checked  # a file handed out before keeps all its blocks until unlinked whole
            if not marked:
                with self._exclusive():
                    marked = self._db.execute(
                        "UPDATE files SET exposed = ?, handed = ? WHERE file = ? AND name = ? AND "
                        "(SELECT COUNT(*) FROM blocks WHERE file = ? AND digest != '') = ?",
                        (boot, seen, file, name, file, blocks)).rowcount
        except sqlite3.Error as err:  # a full device cannot record the mark: read through the blocks
            os.close(fd)
            self._mark_unhealthy(err)
            return None
        except BaseException:
            os.close(fd)
            raise
        if not marked:  # a block was evicted between the check and the mark
            os.close(fd)
            return None
        self._keep_handed(file, (name, size, seen))
        self._note_accesses(file, blocks)
        return fd

    def _keep_handed(self, file: str, handed: tuple[str, int, str]) -> None:
        if file not in self._handed and len(self._handed) >= HANDED_KEPT:  # cleared when full: asked for again
            self._handed.clear()
        self._handed[file] = handed

    def _learn_handed(self) -> None:
        """Remember the files that any process checked and handed out whole in this boot (at most
        :data:`HANDED_KEPT` in all), with the identity of the cache file its check saw (the index's
        ``handed``, :func:`_identity`): their first open here is then an ``open`` checked by :meth:`_reopen`, as
        a later one is, not a query of the index (~7 us of a DataLoader worker's first open of a
        small file, 2026-12-06). A process does this after :data:`LEARN_HANDED_AFTER` queries, so
        a command that opens a few files does not read the whole index, and again each time its
        queries double: a worker whose first epoch was cold (little handed out yet) learns what
        that epoch cached, and the scans cost O(log queries)."""
        rows = self._ro.execute("SELECT file, name, handed FROM files WHERE exposed = ? AND handed IS NOT NULL "
                                "LIMIT ?", (boot_mark(), max(HANDED_KEPT - len(self._handed), 0))).fetchall()
        for file, name, handed in rows:
            value = _handed_value(name, handed)
            if value is not None:  # else not _identity's: asked for when opened
                self._handed.setdefault(file, value)

    def _handed_row(self, file: str) -> tuple[str, int, str] | None:
        """The hand-out of ``file`` that a process checked in this boot, as :meth:`_learn_handed`
        learns it, from the file's own row, without its blocks' rows (~9 us against ~13 us with
        them): where a process opens more files than :data:`HANDED_KEPT` (a DataLoader worker over
        ImageNet), most first opens are asked for so. None when there is none."""
        row = self._ro.execute("SELECT name, handed FROM files WHERE file = ? AND exposed = ? AND handed IS NOT NULL",
                               (file, boot_mark())).fetchone()
        return None if row is None else _handed_value(*row)

    def _reopen(self, file: str, handed: tuple[str, int, str]) -> int | None:
        """A descriptor of the cache file :meth:`open_whole` checked and handed out before
        (``handed``: its name, size and :func:`_identity`), or None when that file is gone: evicted
        whole, truncated behind the cache, or made anew under its name (a put in flight since
        its eviction writes into a new file before it learns the row went: zeros where blocks
        were). Forgets the hand-out then; the caller asks the index again."""
        name, _, identity = handed
        try:
            fd = os.open(os.path.join(self.files, name), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            self._handed.pop(file, None)
            return None
        if _identity(os.fstat(fd)) != identity:
            os.close(fd)
            self._handed.pop(file, None)
            return None
        return fd

    def _check_whole(self, file: str, fd: int, path: str, rows: list[tuple[int, int, str, int]]) -> bool:
        """Read every block of ``file`` (``rows``: its ``(index, size, digest, stride)``) from ``fd``
        and check it; a failing one is dropped."""
        for index, size, digest, stride in rows:
            offset = max(index, 0) * stride
            if digest_range(fd, offset, size) != digest:
                key = join_key(file, index)
                # Read again under the lock: the block may have been evicted and stored anew while
                # it was read (a hole then), and only a row and bytes that still disagree are corrupt.
                with self._exclusive():
                    corrupt = ((path, offset, size, digest) == self._row(key) and _same_file(fd, path)
                               and digest_range(fd, offset, size) != digest)
                if corrupt:
                    self.corrupt += 1
                    log.warning("cache tier %s: block %s failed its checksum at its first hand-out as a "
                                "whole file: dropped, refetched", self.path, key)
                    self._drop(key, path, lost=False)
                return False
        return True

    # -- access times --------------------------------------------------------------------------------

    def _note_accesses(self, file: str, blocks: int) -> None:
        """:meth:`_note_access` of blocks ``0..blocks-1`` of ``file``."""
        for index in range(blocks):
            self._note_access(join_key(file, index))

    def _note_access(self, key: str) -> None:
        """Remember a use of ``key`` for LRU; written with the others at most every
        ``ACCESS_FLUSH_S`` seconds (and before any eviction), not one transaction per read."""
        with self._accessed_lock:
            self._accessed[key] = time.time()
        if time.monotonic() - self._flushed >= ACCESS_FLUSH_S:
            self.flush_accesses(everything=False)

    def flush_accesses(self, everything: bool = True) -> int:
        """Write the access times of the blocks used since the last call, in one transaction.
        ``everything`` False (the periodic write of the hit path): only those of blocks whose time
        this process last wrote ``ACCESS_GRANULARITY_S`` or more before; the others stay pending
        for a later write or the next eviction, which writes them all (so this process's own
        evictions see every use, other processes see a use at most ``ACCESS_GRANULARITY_S`` late);
        and of those, only where the row holds a use ``ACCESS_GRANULARITY_S`` or more older (a
        use another process wrote, or the put, counts: the block's time is then that much behind
        at most, as ``relatime`` keeps a file's).
        A working set re-read every second otherwise rewrote every row of it every second: ~5 µs a
        row, ~12 µs of each 40 µs read over 20,000 small files (2026-12-06). Returns how many
        blocks were marked. A full device cannot take them: they are dropped (only older for LRU)."""
        with self._accessed_lock:
            accessed, self._accessed = self._accessed, {}
            self._flushed = time.monotonic()
            if not everything:
                written = self._written
                due = {k: t for k, t in accessed.items() if t - written.get(k, 0.0) >= ACCESS_GRANULARITY_S}
                self._accessed = {k: t for k, t in accessed.items() if k not in due}
                accessed = due
            if len(self._written) + len(accessed) > WRITTEN_KEPT:  # cleared when full: those are due again
                self._written.clear()
            self._written.update(accessed)
        if accessed and self._db is not None:
            # In the primary key's order, rows that share B-tree pages follow each other: 40,000 of
            # 100,000 rows took 9-13 us a row so against 17-21 us in the order of use (2026-12-06).
            rows = sorted((*split_key(k), t) for k, t in accessed.items())
            # The periodic write leaves alone a row that holds a use less than ACCESS_GRANULARITY_S
            # older (another process's, or the put's): its page stays clean (8,000 such rows of
            # 100,000: 2.9 us a row against 13-17 us rewritten, 2026-12-06). Before an eviction
            # every use is written.
            older = "" if everything else f" AND atime < ?3 - {float(ACCESS_GRANULARITY_S)!r}"
            update = f"UPDATE blocks SET atime = MAX(atime, ?3) WHERE file = ?1 AND idx = ?2{older}"
            try:
                with self._lock, self._db:
                    self._db.execute("BEGIN IMMEDIATE")
                    self._db.executemany(update, rows)
            except (OSError, sqlite3.Error) as err:
                if not _is_full(err):
                    raise
        return len(accessed)

    # -- writing -------------------------------------------------------------------------------------

    def put(self, key: str, data: bytes | memoryview, bulk: bool = False) -> bool:
        """Store a block; False when it is not kept: empty, larger than the high watermark even in an
        empty tier or than its file's stride, the device is full or would be left with less than
        :attr:`free_space_ratio` free (after evicting to the low watermark, or as far as the room
        needs, and trying once more), or the tier is unhealthy. Never raises for a write
        failure: the caller still has the bytes, so the read is served and only caching is skipped.
        ``bulk`` (a warmup's load, read later if at all): the bytes go around the page cache
        (``O_DIRECT``, see :func:`~datacache.cache.extents.write_range`) while the file system
        takes it.

        Three steps, so that puts of many threads and processes write their bytes at once (one
        4 MiB ``pwrite`` into the page cache takes ~10 ms here, and under the lock it capped a
        warmup at ~400 MB/s): under the exclusive lock the block's row is *reserved* (inserted
        with an empty checksum: it counts against the quota, readers do not see it), evicting first
        when it would pass the high mark; the bytes are written and checksummed without the lock;
        under the lock again the checksum completes the row, unless the block was removed
        meanwhile (its range is then freed again: False). True also when the block is stored
        already."""
        file, index = split_key(key)
        size = memoryview(data).nbytes  # bytes, whatever the buffer's item size
        if not 0 < size <= self._high or not self._usable():
            return False
        try:
            for attempt in (1, 2):
                with self._exclusive():
                    short = self._shortfall(size)
                    if attempt == 2 or short:  # the device filled (or would) before the quota
                        self.full_bypasses += 1
                        lagging = attempt == 1 and time.monotonic() - self._made_room_at < ROOM_LAG_S
                        if short > self.used() or lagging:  # eviction would not do, or has not shown yet
                            return False
                        free, used, writing = self._free(), self.used(), self._writing
                        self._evict_to(min(self._low, used) - max(short, size), writing=False)
                        # Measured once: puts of other threads change it, and a second look that
                        # found it short where the first did not (no commit asked) set the lag on
                        # btrfs, which then skipped 40k puts in 5 s.
                        short = self._shortfall(size)
                        committed = bool(short) and commit_frees(self.files)
                        if committed:  # btrfs: its frees show once their transaction commits
                            self.commits += 1
                            short = self._shortfall(size)
                        if short:  # after a commit: puts in flight took the room
                            # Puts in flight may have taken at most ``writing`` of what was freed.
                            if not committed and self._free() - free + writing < (used - self.used()) / 2:
                                self._made_room_at = time.monotonic()  # not shown yet
                            return False
                    reserved = self._reserve(file, index, size)
                    if isinstance(reserved, tuple):
                        with self._writing_lock:
                            self._writing += size
                if not isinstance(reserved, tuple):
                    return reserved
                path, offset, token = reserved
                counted = size  # in ``_writing`` until statvfs counts the block's space

                def allocated() -> None:
                    nonlocal counted
                    with self._writing_lock:
                        self._writing -= counted
                        counted = 0

                try:
                    try:
                        direct = write_range(path, offset, data, private.FILE_MODE, bulk and self.direct_io,
                                             allocated)
                    finally:
                        allocated()  # if write_range did not say so
                    if not direct:
                        log.info("cache tier %s (%s): the file system refuses O_DIRECT; bulk loads write "
                                 "through the page cache", self.path, self.medium)
                        self.direct_io = False
                except OSError as err:
                    with self._exclusive():
                        self._unreserve(file, index, path, offset, size, token)
                    if attempt == 1 and _is_full(err):
                        continue
                    raise
                digest = checksum(data)
                with self._exclusive():
                    stored = self._complete(file, index, path, offset, size, digest, token)
                if stored and not self.healthy:
                    log.warning("cache tier %s (%s) takes writes again", self.path, self.medium)
                    self.healthy, self.last_error = True, ""
                return stored
        except (OSError, sqlite3.Error) as err:
            if self._db is None:  # closed under a put (a load abandoned at shutdown): nothing to report
                return False
            self._mark_unhealthy(err)  # still full, or the index could not grow: counted, stays healthy
        return False

    def _shortfall(self, size: int) -> int:
        """Bytes missing on the device for ``size`` more, besides the blocks this instance's puts
        have reserved and whose space the file system has not allocated yet (``statvfs`` does not
        count them: 16 puts at once left a 64 MiB tmpfs full; counting them on after their
        ``fallocate`` too, a storm evicted blocks it did not need), with :attr:`free_space_ratio`
        of it left free (``statvfs`` of the tier's directory); 0 when there is room, or the file
        system reports no size (ramfs: 0 blocks)."""
        st = os.statvfs(self.path)
        if st.f_blocks == 0:
            return 0
        return max(0, self._writing + size - self._room(st))

    def _device_full(self) -> bool:
        """Whether the tier's device has 0 bytes free (False when it cannot be asked)."""
        try:
            return self._free() == 0
        except OSError:
            return False

    def _free(self) -> int:
        """Bytes free on the tier's device for unprivileged writes (``statvfs``)."""
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def _reserve(self, file: str, index: int, size: int) -> tuple[str, int, float] | bool:
        """Under the lock: insert block ``index`` of ``file`` as pending (empty checksum), after
        evicting to the low watermark when it would pass the high one, and the file's row when it
        is new. ``(path, offset, token)`` to write it at (the token, the row's reservation time,
        names this reservation to :meth:`_complete`); True when the block is stored already; False
        when it is longer than its file's stride. A block pending already is written again by
        this put too (its key names one version's bytes, so both write the same bytes; its first
        put may have been killed, and the block would otherwise stay missing until a later open
        drops the reservation)."""
        row = _first(self._db.execute("SELECT b.digest, f.name, f.stride, b.atime FROM blocks b JOIN files f "
                                      "ON f.file = b.file WHERE b.file = ? AND b.idx = ?", (file, index)))
        if row is not None:
            digest, name, stride, token = row
            return True if digest != _PENDING else (os.path.join(self.files, name), max(index, 0) * stride, token)
        if self.used() + size > self._high:
            self._evict_to(self._low - size)
        known = _first(self._db.execute("SELECT name, stride FROM files WHERE file = ?", (file,)))
        name, stride = known or (uuid.uuid4().hex, max(self.block_size, size))
        if size > stride:
            return False
        token = time.time()
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            if known is None:
                self._db.execute("INSERT INTO files (file, name, stride) VALUES (?, ?, ?)", (file, name, stride))
            self._db.execute("INSERT INTO blocks VALUES (?, ?, ?, ?, ?)", (file, index, size, _PENDING, token))
        return os.path.join(self.files, name), max(index, 0) * stride, token

    def _complete(self, file: str, index: int, path: str, offset: int, size: int, digest: str,
                  token: float) -> bool:
        """Under the lock: give the pending row of a block written at ``offset`` of ``path`` its
        checksum (True also when another put of the block completed it first); if the index's own
        growth took the tier past the high watermark, its WAL is checkpointed and truncated, and
        blocks are evicted to the low watermark only if that was not enough. False when the
        row or the file's row went meanwhile (evicted, deleted, made anew): the written range is
        freed again, as no row names it. False too, touching nothing, when the row is pending
        under another reservation (``token``): this one was evicted while it wrote, the hole
        punched then may have zeroed pages it had copied, and the put that reserved the block
        anew completes it with its own bytes."""
        row = _first(self._db.execute("SELECT b.digest, b.atime FROM blocks b JOIN files f ON f.file = b.file "
                                      "WHERE b.file = ? AND b.idx = ? AND f.name = ?",
                                      (file, index, os.path.basename(path))))
        if row is None:
            self._unreserve(file, index, path, offset, size, token)
            return False
        if row[0] == _PENDING and row[1] != token:
            return False
        if row[0] == _PENDING:
            with self._db:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.execute("UPDATE blocks SET digest = ? WHERE file = ? AND idx = ?", (digest, file, index))
        if self.used() > self._high:  # the index's WAL grew: truncate it first, blocks go only then
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            if self.used() > self._high:
                self._evict_to(self._low)
        return True

    def _unreserve(self, file: str, index: int, path: str, offset: int, size: int, token: float) -> None:
        """Under the lock: drop the pending row of a block whose write failed or was overtaken
        (reserved with ``token``), and free what the write left at ``offset`` of ``path``: the
        whole file when no row names it any more (it was removed, or only this block was in it),
        else the block's range, unless another put of the block holds it (completed, or writing
        under a reservation of its own)."""
        name = os.path.basename(path)
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("DELETE FROM blocks WHERE file = ? AND idx = ? AND digest = ? AND atime = ? AND "
                             "(SELECT name FROM files WHERE file = ?) = ?", (file, index, _PENDING, token, file, name))
            if not _first(self._db.execute("SELECT 1 FROM blocks WHERE file = ?", (file,))):
                self._db.execute("DELETE FROM files WHERE file = ? AND name = ?", (file, name))
        named = _first(self._db.execute("SELECT 1 FROM files WHERE name = ?", (name,)))
        if named and _first(self._db.execute("SELECT 1 FROM blocks b JOIN files f ON f.file = b.file WHERE "
                                             "b.file = ? AND b.idx = ? AND f.name = ?", (file, index, name))):
            return  # another put of the block holds it: its bytes stay
        self._forget_write(path, offset, size, whole=not named)

    @staticmethod
    def _forget_write(path: str, offset: int, size: int, whole: bool) -> None:
        """Free what a failed write left: the new file ``path`` (``whole``), else its range."""
        with contextlib.suppress(OSError):
            if whole:
                os.unlink(path)
            else:
                punch_hole(path, offset, size)

    # -- removing ------------------------------------------------------------------------------------

    def _eviction_order(self, writing: bool):
        """Eviction candidates, least worth keeping first: ``(file, index, size, exposed)`` of each
        stored block, least recently used first (the access times :meth:`flush_accesses` wrote),
        or in the order :attr:`rank_victims` gives them. Blocks that puts reserved and are still
        writing too with ``writing``; without it, only reservations older than
        ``ORPHAN_GRACE_S`` (a killed put's). The one place that ranks eviction."""
        cursor = self._db.execute("SELECT b.file, b.idx, b.size, f.exposed FROM blocks b JOIN files f "
                                  "ON f.file = b.file WHERE ? OR b.digest != '' OR b.atime < ? ORDER BY b.atime",
                                  (writing, time.time() - ORPHAN_GRACE_S))
        try:
            lru = (row for batch in iter(lambda: cursor.fetchmany(256), []) for row in batch)
            yield from lru if self.rank_victims is None else self.rank_victims(lru)
        finally:
            cursor.close()

    def _evict_to(self, target: int, writing: bool = True) -> None:
        """Evict blocks in :meth:`_eviction_order` until ``used() <= target`` (under the lock): a
        file handed out whole goes whole (unlinked), other blocks one at a time (holes punched).
        Not more: the low watermark is a floor, not a suggestion to empty the tier. Not blocks
        being written unless ``writing`` (the quota counts them; making room on a device must
        not: the bytes of such a block land on it all the same)."""
        self.flush_accesses()  # this process's recent uses count
        excess = self.used() - target
        if excess <= 0:
            return
        doomed: dict[str, list[int] | None] = {}
        freed = 0
        for file, index, size, exposed in self._eviction_order(writing):
            if freed >= excess:
                break
            if exposed:
                if file not in doomed:
                    doomed[file] = None
                    (whole,) = _first(self._db.execute("SELECT SUM(size) FROM blocks WHERE file = ?", (file,)))
                    freed += whole or 0
            elif doomed.get(file, []) is not None:
                doomed.setdefault(file, []).append(index)
                freed += size
        for file, indexes in doomed.items():
            self.evictions += self._remove(file, indexes)

    def _remove(self, file: str, indexes: list[int] | None, name: str | None = None) -> int:
        """Delete blocks ``indexes`` of ``file`` (None: all) from the index, then free their bytes:
        the whole file is unlinked when no block would be left or it was handed out whole, else
        holes are punched. With ``name``, only while the file's row names that cache file (not a
        file made anew since). Under the exclusive lock. Returns how many blocks were removed."""
        known = _first(self._db.execute("SELECT name, stride, exposed FROM files WHERE file = ?", (file,)))
        if known is None or (name is not None and known[0] != name):
            return 0
        name, stride, exposed = known
        rows = self._db.execute("SELECT idx, size FROM blocks WHERE file = ?", (file,)).fetchall()
        doomed = rows if indexes is None or exposed else [r for r in rows if r[0] in set(indexes)]
        whole = len(doomed) == len(rows)
        path = os.path.join(self.files, name)
        try:
            self._delete_rows(file, doomed, whole)
        except sqlite3.OperationalError as err:
            if not _is_full(err):
                raise
            # The device is too full for the index to record a deletion: the whole file goes
            # first, then the rows (a block whose file is gone is dropped when found, should this
            # fail too). Before, a btrfs filled to 0 bytes free stayed so (1 fill in 12).
            self._unlink(file, path)
            commit_frees(self.files)
            self.emergency_unlinks += 1
            if self.emergency_unlinks == 1:  # once: a storm of puts meets it many times
                log.warning("cache tier %s: the device is too full for the index to record an eviction: "
                            "cache files are removed first", self.path)
            self._delete_rows(file, rows, True)
            return len(rows)
        if whole:
            self._unlink(file, path)
            return len(doomed)
        self._open_files.forget(path)
        try:
            for index, size in doomed:
                punch_hole(path, max(index, 0) * stride, size)
        except OSError:  # the file is gone (every block with it), or its file system cannot punch holes
            return len(doomed) + self._remove(file, None)
        return len(doomed)

    def _delete_rows(self, file: str, doomed: list[tuple[int, int]], whole: bool) -> None:
        """Under the lock: delete the rows of blocks ``doomed`` (``(index, size)``) of ``file``, and
        the file's row when ``whole``. Raises ``sqlite3.OperationalError`` ("database or disk is
        full") when the device has no room for the index's journal."""
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            if whole:
                self._db.execute("DELETE FROM blocks WHERE file = ?", (file,))
                self._db.execute("DELETE FROM files WHERE file = ?", (file,))
            else:
                self._db.executemany("DELETE FROM blocks WHERE file = ? AND idx = ?", [(file, i) for i, _ in doomed])
        for index, _ in doomed:
            self._rows.pop(join_key(file, index), None)

    def _unlink(self, file: str, path: str) -> None:
        """Remove the cache file ``path`` of ``file`` (a reader holding it open keeps its bytes)."""
        self._open_files.forget(path)  # so that the space goes with the unlink
        self._handed.pop(file, None)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def _drop(self, key: str, path: str | None, lost: bool) -> None:
        """Drop one block found lost (its file gone or short: counted in ``lost``) or corrupt, if
        its row still names the cache file ``path`` (a copy stored anew meanwhile stays)."""
        self._rows.pop(key, None)
        if not self._usable() or self._db is None:
            return
        file, index = split_key(key)
        try:
            with self._exclusive():
                removed = self._remove(file, [index], os.path.basename(path) if path else None)
        except sqlite3.Error as err:
            self._mark_unhealthy(err)
            return
        if lost and removed:
            self.lost += 1

    def discard(self, key: str) -> None:
        """Drop one block (e.g. handed off to its owner); no error when it is already gone."""
        if self._db is None:
            return
        file, index = split_key(key)
        with self._exclusive():
            self._remove(file, [index])

    def delete_prefix(self, prefix: str) -> int:
        """Delete every block whose key starts with ``prefix``; returns how many."""
        if self._db is None:
            return 0
        doomed: dict[str, list[int]] = {}
        for key in self.keys():
            if key.startswith(prefix):
                file, index = split_key(key)
                doomed.setdefault(file, []).append(index)
        with self._exclusive():
            return sum(self._remove(file, indexes) for file, indexes in doomed.items())

    # -- sweeping, health ----------------------------------------------------------------------------

    def _sweep_due(self) -> bool:
        """True when no process started a sweep of this directory in the last ``ORPHAN_GRACE_S``
        seconds (the mtime of its ``.swept`` file tells), which it then marks as started now: a
        sweep on every open slowed the first reads of each new client."""
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
        """Delete cache files that no index row names (``known``: the indexed names) and older than
        ``ORPHAN_GRACE_S`` (younger ones may be another process's first write in flight). Runs in a
        thread at start-up, touching only the file system."""
        self.orphans_removed += self._delete_cache_files(known, cutoff=time.time() - ORPHAN_GRACE_S)

    def _drop_stale_reservations(self, cutoff: float) -> int:
        """Drop the pending block rows reserved before ``cutoff`` (seconds since the epoch): puts
        killed between reserving a block and completing it. At every open (one lookup in the
        partial index of reserved rows); not in the sweep thread, which must not use the index
        connection a ``close`` may be closing. Returns how many."""
        with self._exclusive():
            # digest = '' spelled as the literal: the partial index blocks_pending serves only that
            rows = self._db.execute("SELECT b.file, b.idx, b.size, f.name, f.stride, b.atime FROM blocks b JOIN files f "
                                    "ON f.file = b.file WHERE b.digest = '' AND b.atime < ?", (cutoff,)).fetchall()
            for file, index, size, name, stride, token in rows:
                self._unreserve(file, index, os.path.join(self.files, name), max(index, 0) * stride, size, token)
        return len(rows)

    def _delete_cache_files(self, known: set[str], cutoff: float | None) -> int:
        """Delete the cache files not named in ``known`` and, unless ``cutoff`` is None, last
        modified before ``cutoff`` (seconds since the epoch). Returns how many."""
        removed = 0
        try:
            entries = list(os.scandir(self.files))
        except FileNotFoundError:
            return 0
        for entry in entries:
            if entry.name in known:
                continue
            with contextlib.suppress(FileNotFoundError):
                if cutoff is None or entry.stat(follow_symlinks=False).st_mtime < cutoff:
                    os.unlink(entry.path)
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
            if self._db is None:
                return self._open()
            if not self._damaged:
                return True
            # Damaged while open: open (so replace) it anew, then close the old handles (a read
            # still using one gets an error, so a miss).
            old = self._db, self._ro, self._lock_fd
            if not self._open():
                self._db = self._ro = None
            _close(*old)
            return self._db is not None

    def _mark_unhealthy(self, err: BaseException) -> None:
        """Stop using the tier for ``RECHECK_S`` seconds after a device or index error; a full
        device only counts in ``full_bypasses`` (reads of what is stored go on)."""
        if _is_full(err):
            self.full_bypasses += 1
            return
        if self.healthy:
            log.warning("cache tier %s (%s) is unhealthy, reads go to the UFS: %s", self.path, self.medium, err)
        self.healthy, self.last_error = False, f"a write failed: {err}: fix the device"
        self._damaged = _is_damaged(err)
        self.write_errors += 1
        self._unhealthy_since = time.monotonic()

    def close(self) -> None:
        if self._db is None:
            return
        with contextlib.suppress(OSError, sqlite3.Error):  # a failing device loses only LRU order
            self.flush_accesses()
        _close(self._db, self._ro, self._lock_fd)
        self._db = self._ro = None
        self._open_files.close()


class _Readers:
    """One connection to the index per thread, for lookups (Python's ``sqlite3`` does not promise
    that one connection serves several threads at once)."""

    def __init__(self, path: str):
        self._path = path
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()

    def execute(self, sql: str, args: tuple = ()) -> sqlite3.Cursor:
        con = getattr(self._local, "con", None)
        if con is None:
            con = sqlite3.connect(self._path, timeout=60, isolation_level=None, check_same_thread=False)
            with self._lock:
                self._all.append(con)
            self._local.con = con
        return con.execute(sql, args)

    def close(self) -> None:
        with self._lock:
            for con in self._all:
                con.close()
            self._all.clear()


def _identity(st: os.stat_result) -> str:
    """``size:inode:ctime_ns:allocated 512-byte blocks`` of a cache file: what tells the file a
    check read from one made anew under its name or changed behind the cache. The allocated
    blocks tell them apart where the change time has whole seconds (ext4 with 128-byte inodes)
    and the inode is handed back: a file made anew by a put in flight holds fewer blocks (holes
    where the others were), as does one truncated and extended again. A file system that
    changes them itself (XFS trimming preallocation) costs a check again, never wrong bytes."""
    return f"{st.st_size}:{st.st_ino}:{st.st_ctime_ns}:{st.st_blocks}"


def _handed_value(name: str, handed) -> tuple[str, int, str] | None:
    """``(name, size, identity)`` of an index's ``handed`` value (:func:`_identity`'s form), or
    None for a value of another form (damaged, or of another version)."""
    fields = str(handed).split(":")
    if len(fields) == 4 and all(f.isdecimal() for f in fields):
        return name, int(fields[0]), handed
    return None


def _add_handed(db: sqlite3.Connection) -> None:
    """Add the ``handed`` column to an index made before it (NULL: the hand-out is asked for at
    its first open, see :meth:`DiskTier._learn_handed`). Raises ``sqlite3.Error`` when it cannot."""
    def has_it() -> bool:
        return any(row[1] == "handed" for row in db.execute("PRAGMA table_info(files)"))
    if has_it():
        return
    try:
        db.execute("ALTER TABLE files ADD COLUMN handed TEXT")
    except sqlite3.OperationalError:
        if not has_it():  # another process's tier added it meanwhile: fine
            raise


def _close(db: sqlite3.Connection, ro: _Readers, lock_fd: int) -> None:
    db.close()
    ro.close()
    os.close(lock_fd)


def _same_file(fd: int, path: str) -> bool:
    """Whether ``fd`` is open on the file ``path`` names now (not one unlinked since)."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _first(cursor: sqlite3.Cursor) -> tuple | None:
    """The first row of ``cursor``'s query, or None, with the statement run to its end: a
    statement left open (``fetchone``) keeps its read transaction, and the connection then goes on
    reading an old snapshot of the index."""
    rows = cursor.fetchall()
    return rows[0] if rows else None


def _read_verified(open_files: OpenFiles, row: tuple[str, int, int, str],
                   pieces: bool) -> tuple[PieceBlock | bytes, str]:
    """``(the block's bytes, their xxh3-64 hex digest)`` for a :meth:`DiskTier._row`; in pieces
    when asked for and the block is longer than one. Raises ``OSError`` (``FileNotFoundError``:
    the cache file is gone)."""
    with open_files.using(row[0]) as fd:
        if pieces and row[2] > PIECE:
            return read_pieces(fd, row[1], row[2])
        data = read_range(fd, row[1], row[2])
    return data, checksum(data)
