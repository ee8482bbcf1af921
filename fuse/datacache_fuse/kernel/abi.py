"""The FUSE kernel protocol as bytes: opcodes, flags and the struct layouts the transport uses.

Source: the kernel's ``include/uapi/linux/fuse.h`` (protocol 7.45; libfuse ships the same file as
``include/fuse_kernel.h``). The system's ``/usr/include/linux/fuse.h`` may be older (7.38 here)
and lacks the passthrough parts (7.40): ``FUSE_PASSTHROUGH`` (bit 37, i.e. bit 5 of ``flags2``
under ``FUSE_INIT_EXT``), ``FOPEN_PASSTHROUGH``, ``backing_id`` in ``fuse_open_out``,
``max_stack_depth`` in ``fuse_init_out`` and the ``FUSE_DEV_IOC_BACKING_*`` ioctls.

Only what a read-only file system needs is spelled out; every struct is little-endian-native
(``=``), 64-bit aligned as the header requires, and named after its C struct.
"""

from __future__ import annotations

import enum
import struct

KERNEL_VERSION = 7
KERNEL_MINOR_VERSION = 45
ROOT_ID = 1
MIN_READ_BUFFER = 8192  # bytes: the kernel refuses smaller reads of /dev/fuse


class Op(enum.IntEnum):
    """``enum fuse_opcode``."""

    LOOKUP = 1
    FORGET = 2  # no reply
    GETATTR = 3
    SETATTR = 4
    READLINK = 5
    SYMLINK = 6
    MKNOD = 8
    MKDIR = 9
    UNLINK = 10
    RMDIR = 11
    RENAME = 12
    LINK = 13
    OPEN = 14
    READ = 15
    WRITE = 16
    STATFS = 17
    RELEASE = 18
    FSYNC = 20
    SETXATTR = 21
    GETXATTR = 22
    LISTXATTR = 23
    REMOVEXATTR = 24
    FLUSH = 25
    INIT = 26
    OPENDIR = 27
    READDIR = 28
    RELEASEDIR = 29
    FSYNCDIR = 30
    GETLK = 31
    SETLK = 32
    SETLKW = 33
    ACCESS = 34
    CREATE = 35
    INTERRUPT = 36  # no reply
    BMAP = 37
    DESTROY = 38
    IOCTL = 39
    POLL = 40
    NOTIFY_REPLY = 41
    BATCH_FORGET = 42  # no reply
    FALLOCATE = 43
    READDIRPLUS = 44
    RENAME2 = 45
    LSEEK = 46
    COPY_FILE_RANGE = 47
    SETUPMAPPING = 48
    REMOVEMAPPING = 49
    SYNCFS = 50
    TMPFILE = 51
    STATX = 52
    COPY_FILE_RANGE_64 = 53


#: Requests that would change the tree or a file: a read-only mount answers them EROFS.
WRITE_OPS = frozenset({Op.SETATTR, Op.SYMLINK, Op.MKNOD, Op.MKDIR, Op.UNLINK, Op.RMDIR, Op.RENAME,
                       Op.LINK, Op.WRITE, Op.SETXATTR, Op.REMOVEXATTR, Op.CREATE, Op.FALLOCATE,
                       Op.RENAME2, Op.COPY_FILE_RANGE, Op.TMPFILE, Op.COPY_FILE_RANGE_64})
#: Requests the kernel sends without waiting for a reply.
NO_REPLY_OPS = frozenset({Op.FORGET, Op.BATCH_FORGET, Op.INTERRUPT})


class Notify(enum.IntEnum):
    """``enum fuse_notify_code`` (sent as the ``error`` of an unsolicited ``fuse_out_header``)."""

    POLL = 1
    INVAL_INODE = 2
    INVAL_ENTRY = 3
    STORE = 4
    RETRIEVE = 5
    DELETE = 6


class InitFlag(enum.IntFlag):
    """INIT request/reply flags; bits 32..63 travel in ``flags2`` (only with ``INIT_EXT``)."""

    ASYNC_READ = 1 << 0
    POSIX_LOCKS = 1 << 1
    ATOMIC_O_TRUNC = 1 << 3
    EXPORT_SUPPORT = 1 << 4
    BIG_WRITES = 1 << 5
    SPLICE_WRITE = 1 << 7
    SPLICE_MOVE = 1 << 8
    SPLICE_READ = 1 << 9
    FLOCK_LOCKS = 1 << 10
    HAS_IOCTL_DIR = 1 << 11
    AUTO_INVAL_DATA = 1 << 12
    DO_READDIRPLUS = 1 << 13
    READDIRPLUS_AUTO = 1 << 14
    ASYNC_DIO = 1 << 15
    WRITEBACK_CACHE = 1 << 16
    NO_OPEN_SUPPORT = 1 << 17
    PARALLEL_DIROPS = 1 << 18
    ABORT_ERROR = 1 << 21
    MAX_PAGES = 1 << 22
    CACHE_SYMLINKS = 1 << 23
    NO_OPENDIR_SUPPORT = 1 << 24
    EXPLICIT_INVAL_DATA = 1 << 25
    INIT_EXT = 1 << 30
    HAS_EXPIRE_ONLY = 1 << 35
    DIRECT_IO_ALLOW_MMAP = 1 << 36
    PASSTHROUGH = 1 << 37
    NO_EXPORT_SUPPORT = 1 << 38
    HAS_RESEND = 1 << 39
    OVER_IO_URING = 1 << 41


class OpenFlag(enum.IntFlag):
    """``FOPEN_*``: flags of an OPEN/OPENDIR reply. The kernel refuses (EIO to the caller)
    ``PASSTHROUGH`` with any flag outside ``PASSTHROUGH_MASK`` (fs/fuse/iomode.c)."""

    DIRECT_IO = 1 << 0
    KEEP_CACHE = 1 << 1
    NONSEEKABLE = 1 << 2
    CACHE_DIR = 1 << 3
    STREAM = 1 << 4
    NOFLUSH = 1 << 5
    PARALLEL_DIRECT_WRITES = 1 << 6
    PASSTHROUGH = 1 << 7


PASSTHROUGH_MASK = OpenFlag.PASSTHROUGH | OpenFlag.DIRECT_IO | OpenFlag.PARALLEL_DIRECT_WRITES | OpenFlag.NOFLUSH

GETATTR_FH = 1 << 0  # fuse_getattr_in.getattr_flags: fh is valid
FILESYSTEM_MAX_STACK_DEPTH = 2  # the kernel's limit for max_stack_depth


# -- structs -------------------------------------------------------------------------------------
IN_HEADER = struct.Struct("=IIQQIIIHH")  # len, opcode, unique, nodeid, uid, gid, pid, total_extlen, pad
OUT_HEADER = struct.Struct("=IiQ")  # len, error (negative errno or notify code), unique

INIT_IN = struct.Struct("=IIIII")  # major, minor, max_readahead, flags, flags2 (then 11 unused u32)
# major, minor, max_readahead, flags, max_background, congestion_threshold, max_write, time_gran,
# max_pages, map_alignment, flags2, max_stack_depth, request_timeout, unused[11]
INIT_OUT = struct.Struct("=IIIIHHIIHHIIH22x")

# ino, size, blocks, atime, mtime, ctime, atimensec, mtimensec, ctimensec, mode, nlink, uid, gid,
# rdev, blksize, flags
ATTR = struct.Struct("=QQQQQQIIIIIIIIII")
ENTRY_OUT = struct.Struct("=QQQQII" + ATTR.format[1:])  # nodeid, generation, entry_valid, attr_valid, *nsec, attr
ATTR_OUT = struct.Struct("=QII" + ATTR.format[1:])  # attr_valid, attr_valid_nsec, dummy, attr

FORGET_IN = struct.Struct("=Q")  # nlookup
BATCH_FORGET_IN = struct.Struct("=II")  # count, dummy
FORGET_ONE = struct.Struct("=QQ")  # nodeid, nlookup
GETATTR_IN = struct.Struct("=IIQ")  # getattr_flags, dummy, fh
OPEN_IN = struct.Struct("=II")  # flags, open_flags
OPEN_OUT = struct.Struct("=QIi")  # fh, open_flags, backing_id
READ_IN = struct.Struct("=QQIIQII")  # fh, offset, size, read_flags, lock_owner, flags, padding
RELEASE_IN = struct.Struct("=QIIQ")  # fh, flags, release_flags, lock_owner
FLUSH_IN = struct.Struct("=QIIQ")  # fh, unused, padding, lock_owner
# blocks, bfree, bavail, files, ffree, bsize, namelen, frsize, padding, spare[6]
STATFS_OUT = struct.Struct("=QQQQQIIII24x")
GETXATTR_IN = struct.Struct("=II")  # size, padding (then the name, NUL-terminated)
GETXATTR_OUT = struct.Struct("=II")  # size, padding
ACCESS_IN = struct.Struct("=II")  # mask, padding
INTERRUPT_IN = struct.Struct("=Q")  # unique
IOCTL_IN = struct.Struct("=QIIQII")  # fh, flags, cmd, arg, in_size, out_size
LSEEK_IN = struct.Struct("=QQII")  # fh, offset, whence, padding
LSEEK_OUT = struct.Struct("=Q")  # offset
DIRENT = struct.Struct("=QQII")  # ino, off, namelen, type (then the name, padded to 8 bytes)

NOTIFY_INVAL_INODE_OUT = struct.Struct("=Qqq")  # ino, off, len
NOTIFY_INVAL_ENTRY_OUT = struct.Struct("=QII")  # parent, namelen, flags (then the name and a NUL)
EXPIRE_ONLY = 1 << 0  # fuse_notify_inval_entry_out.flags

BACKING_MAP = struct.Struct("=iIQ")  # fd, flags, padding


def dirent_size(namelen: int, plus: bool = False) -> int:
    """Bytes one ``fuse_dirent`` (``plus``: ``fuse_direntplus``) with a ``namelen``-byte name takes
    in a READDIR reply, padded to 8 bytes (``FUSE_DIRENT_ALIGN``)."""
    n = (ENTRY_OUT.size if plus else 0) + DIRENT.size + namelen
    return (n + 7) & ~7


# -- ioctls on /dev/fuse (asm-generic _IOC encoding) ---------------------------------------------
_IOC_WRITE, _IOC_READ = 1, 2
DEV_IOC_MAGIC = 229


def _ioc(direction: int, nr: int, size: int) -> int:
    return (direction << 30) | (size << 16) | (DEV_IOC_MAGIC << 8) | nr


DEV_IOC_CLONE = _ioc(_IOC_READ, 0, 4)  # _IOR(229, 0, uint32_t): argument is the session's fd
DEV_IOC_BACKING_OPEN = _ioc(_IOC_WRITE, 1, BACKING_MAP.size)  # returns the backing id
DEV_IOC_BACKING_CLOSE = _ioc(_IOC_WRITE, 2, 4)  # _IOW(229, 2, uint32_t)
