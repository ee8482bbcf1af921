"""What a file system served by :class:`~.session.Session` implements: synchronous handlers.

The session calls these methods from its worker threads (several at once: a handler that keeps
state guards it), with the request's arguments already decoded. A handler answers an error by
raising ``OSError`` with an errno (``OSError(errno.ENOENT, "...")``; ``FileNotFoundError`` and
friends without an errno are mapped by type, see :mod:`.errnos`); anything else is logged and
answered EIO, and the session keeps serving.

Units everywhere: inode numbers and handles are unsigned 64-bit ints (``ROOT_ID`` = 1 is the
mount's root), offsets and sizes are bytes, timeouts are seconds (float), times are ns since the
epoch. Names are ``bytes`` as the kernel sends them (no encoding is assumed).

The defaults make a minimal read-only file system: every method a tree must have (``lookup``,
``getattr``, ``readdir``, ``read``) raises ENOSYS until overridden; ``open``/``opendir`` answer
with handle 0; ``flush``, ``poll``, ``lseek`` answer ENOSYS (the kernel then stops sending them
and uses its generic code); ``ioctl`` answers ENOTTY (so ``isatty()`` costs one round trip);
``getxattr`` answers ENODATA, ``listxattr`` an empty list.
"""

from __future__ import annotations

import errno
import stat as _stat
from dataclasses import dataclass
from typing import Callable


@dataclass(slots=True)
class Attr:
    """``struct fuse_attr``: what ``stat`` shows. ``mode`` includes the type bits
    (``stat.S_IFREG | 0o444``); ``blocks`` counts 512-byte units; ``blksize`` is the preferred I/O
    size in bytes; times are ns since the epoch."""

    ino: int
    mode: int
    size: int = 0
    nlink: int = 1
    uid: int = 0
    gid: int = 0
    blocks: int | None = None  # None: ceil(size / 512)
    blksize: int = 128 * 1024
    atime_ns: int = 0
    mtime_ns: int = 0
    ctime_ns: int = 0
    rdev: int = 0


@dataclass(slots=True)
class EntryOut:
    """The answer to LOOKUP (and one READDIRPLUS entry): the inode ``ino`` with ``attr``.

    ``ino`` 0 is a negative entry: the kernel remembers that the name does not exist for
    ``entry_timeout`` seconds. A positive entry counts as one lookup of ``ino``, which a later
    :meth:`Operations.forget` gives back. ``generation``: ``(ino, generation)`` must be unique for
    the life of the file system (reuse an inode number only with a higher generation)."""

    ino: int
    attr: Attr | None = None
    generation: int = 0
    entry_timeout: float = 1.0
    attr_timeout: float = 1.0


@dataclass(slots=True)
class OpenOut:
    """The answer to OPEN / OPENDIR.

    ``fh``: the handle READ/RELEASE will carry. ``keep_cache``: keep the kernel's page cache of the
    inode from earlier opens (right when an inode never changes its bytes). ``direct_io``: bypass
    the page cache (every read reaches the daemon; no shared mmap). ``passthrough``: a local file
    holding exactly the file's bytes, as a path or a read-only descriptor (the session closes it):
    the kernel then reads (and mmaps, splices) it directly and sends no READ for this handle; the
    session registers it with the
    kernel (one backing id per backing file, shared by its handles, closed when the last handle
    is released) and falls back to serving READ when the kernel refuses, saying why once in the
    log. ``keep_cache`` is dropped on a passthrough handle (the kernel refuses the pair).
    ``cache_dir``: OPENDIR only, let the kernel cache the directory's entries. ``reopen``: with a
    handle passed through, the inode's next read-only OPENs may be answered by the session's
    compiled loops without calling :meth:`Operations.open` (same backing file, handle
    ``FAST_FH``; :meth:`Operations.reopened` is told at their RELEASE), until the kernel forgets
    the inode (the operations call ``session.backing.forget(ino)`` when its lookup count reaches
    0), its backing file is unlinked, or the operations call ``session.backing.retire_reopens()``."""

    fh: int = 0
    keep_cache: bool = False
    direct_io: bool = False
    passthrough: str | int | None = None
    cache_dir: bool = False
    nonseekable: bool = False
    reopen: bool = False


@dataclass(slots=True)
class StatFs:
    """``statvfs``: ``blocks``/``bfree``/``bavail`` in units of ``frsize`` bytes."""

    blocks: int = 0
    bfree: int = 0
    bavail: int = 0
    files: int = 0
    ffree: int = 0
    bsize: int = 4096
    namelen: int = 255
    frsize: int = 4096


@dataclass(slots=True)
class DirEntry:
    """One entry of READDIR: ``name`` (bytes), ``ino``, ``mode`` (only the type bits count) and
    ``next_offset``: the offset a later READDIR passes to continue *after* this entry (any
    non-zero cookie the file system understands; offsets must stay valid across calls)."""

    name: bytes
    ino: int
    mode: int
    next_offset: int


#: ``add(entry) -> bool`` given to readdir: False when the reply is full (the entry was NOT sent).
AddEntry = Callable[[DirEntry], bool]
#: ``add(name, entry_out, next_offset) -> bool`` given to readdirplus (see :meth:`Operations.readdirplus`).
AddEntryPlus = Callable[[bytes, EntryOut, int], bool]


@dataclass(slots=True)
class Request:
    """Who asked: the caller's ``uid``, ``gid`` and ``pid`` (as the kernel saw them)."""

    uid: int = 0
    gid: int = 0
    pid: int = 0


class Operations:
    """Base class of a read-only file system served by :class:`~.session.Session`.

    Subclasses override what they serve. Methods are called from several threads at once.
    """

    #: True when :meth:`readdirplus` is implemented: the session then asks the kernel for
    #: READDIRPLUS (entries with attributes, saving a LOOKUP per name).
    readdirplus_enabled: bool = False

    # -- lifecycle -------------------------------------------------------------------------------
    def init(self, session) -> None:
        """Called once the kernel's INIT has been answered (``session.kernel`` tells what the
        kernel offered, ``session.passthrough`` whether passthrough is on)."""

    def destroy(self) -> None:
        """Called once when the session ends (DESTROY, or the connection went away)."""

    # -- names and attributes --------------------------------------------------------------------
    def lookup(self, parent: int, name: bytes, req: Request) -> EntryOut:
        """The entry ``name`` in directory ``parent`` (one more lookup of the returned inode).
        Errors: ENOENT (or a negative :class:`EntryOut` with ``ino=0``), ENOTDIR."""
        raise OSError(errno.ENOSYS, "lookup")

    def forget(self, ino: int, nlookup: int) -> None:
        """The kernel dropped ``nlookup`` lookups of ``ino`` (no reply; never raises)."""

    def getattr(self, ino: int, fh: int | None, req: Request) -> tuple[Attr, float]:
        """``(attr, attr_timeout seconds)`` of ``ino``; ``fh`` when the caller has it open
        (``fstat``). Errors: ENOENT, ESTALE."""
        raise OSError(errno.ENOSYS, "getattr")

    def access(self, ino: int, mask: int, req: Request) -> None:
        """Raise EACCES (EROFS for ``W_OK``) when ``mask`` (``os.R_OK|W_OK|X_OK``) is denied. Only
        sent without the ``default_permissions`` mount option."""
        if mask & 2:  # os.W_OK
            raise OSError(errno.EROFS, "read-only file system")

    def statfs(self, ino: int, req: Request) -> StatFs:
        """``df`` of the mount."""
        return StatFs()

    # -- files -----------------------------------------------------------------------------------
    def open(self, ino: int, flags: int, req: Request) -> OpenOut:
        """Open ``ino`` with ``os.O_*`` ``flags`` (never for writing: the session answers EROFS
        first). Raise ENOSYS (once) to switch the session to the kernel's no-open mode: no OPEN
        and RELEASE are sent any more, READs then carry ``fh`` 0 and the page cache is kept.
        Errors: EISDIR, ESTALE, ENOENT."""
        return OpenOut()

    def read(self, ino: int, fh: int, offset: int, size: int) -> bytes | bytearray | memoryview:
        """At most ``size`` bytes of ``ino`` from ``offset`` (fewer only at end of file: a short
        read is the end of file to the kernel). Any bytes-like object; the session writes it to
        the kernel without copying. Errors: EIO, ESTALE, EBADF."""
        raise OSError(errno.ENOSYS, "read")

    def flush(self, ino: int, fh: int) -> None:
        """``close()`` of a descriptor. ENOSYS (the default) stops FLUSH for the session."""
        raise OSError(errno.ENOSYS, "flush")

    def release(self, ino: int, fh: int) -> None:
        """The last descriptor of handle ``fh`` is closed (no error reaches anyone)."""

    def reopened(self, ino: int) -> None:
        """A handle of ``ino`` that the session opened without :meth:`open` (``OpenOut.reopen``)
        is closed (no error reaches anyone)."""

    def lseek(self, ino: int, fh: int, offset: int, whence: int) -> int:
        """``SEEK_DATA``/``SEEK_HOLE`` from ``offset``: the resulting offset. ENOSYS (the
        default) makes the kernel use its generic code for the session."""
        raise OSError(errno.ENOSYS, "lseek")

    def ioctl(self, ino: int, fh: int, cmd: int, arg: int, in_data: bytes, out_size: int) -> bytes:
        """An ``ioctl`` on an open file: the output (at most ``out_size`` bytes). ENOTTY (the
        default) is what ``isatty()`` expects."""
        raise OSError(errno.ENOTTY, "not a terminal")

    # -- directories -----------------------------------------------------------------------------
    def opendir(self, ino: int, flags: int, req: Request) -> OpenOut:
        """Open directory ``ino``. Raise ENOSYS (once) for the kernel's no-opendir mode
        (READDIR then carries ``fh`` 0). Errors: ENOTDIR, ENOENT."""
        return OpenOut()

    def readdir(self, ino: int, fh: int, offset: int, add: AddEntry) -> None:
        """Call ``add(DirEntry)`` for the entries after cookie ``offset`` (0: from the start;
        ``"."`` and ``".."`` are the file system's to list, or not) until it returns False (the
        reply is full; that entry was not sent) or the directory ends."""
        raise OSError(errno.ENOSYS, "readdir")

    def readdirplus(self, ino: int, fh: int, offset: int, add: AddEntryPlus) -> None:
        """As :meth:`readdir` with attributes: ``add(name, EntryOut, next_offset)``. Every entry
        for which ``add`` returned True counts as one lookup of its inode (a later ``forget``
        gives it back); one that returned False was not sent. Used only when
        ``readdirplus_enabled``."""
        raise OSError(errno.ENOSYS, "readdirplus")

    def releasedir(self, ino: int, fh: int) -> None:
        """The directory handle ``fh`` is closed."""

    # -- xattrs ----------------------------------------------------------------------------------
    def getxattr(self, ino: int, name: bytes, req: Request) -> bytes:
        """The value of extended attribute ``name``. Errors: ENODATA (no such attribute)."""
        raise OSError(errno.ENODATA, "no such attribute")

    def listxattr(self, ino: int, req: Request) -> list[bytes]:
        """The names of the extended attributes of ``ino``."""
        return []


def attr_of_stat(st, ino: int | None = None) -> Attr:
    """An :class:`Attr` from an ``os.stat_result`` (the inode number replaced by ``ino``)."""
    return Attr(ino=st.st_ino if ino is None else ino, mode=st.st_mode, size=st.st_size, nlink=st.st_nlink,
                uid=st.st_uid, gid=st.st_gid, blocks=st.st_blocks, blksize=st.st_blksize,
                atime_ns=st.st_atime_ns, mtime_ns=st.st_mtime_ns, ctime_ns=st.st_ctime_ns, rdev=st.st_rdev)


def dirent_type(mode: int) -> int:
    """The ``d_type`` (``DT_*``) of a ``st_mode``: its type bits shifted down 12."""
    return _stat.S_IFMT(mode) >> 12
