"""Byte ranges of a cache file: the I/O the disk tier does on one file per file version.

A block lives at ``index * stride`` of its file version's file (see :mod:`datacache.cache.disk`).
These helpers read one back (whole, or in :data:`~datacache.cache.blocks.PIECE` pieces, hashed as
read), write one at its offset (through the page cache, a long one by a shared mapping that the
kernel copies into, so that threads filling one file do not queue on its inode lock, or around it
with ``O_DIRECT`` for a warmup's bulk load), ask the kernel to read one ahead, and free one (punch
a hole).
"""

from __future__ import annotations

import array
import ctypes
import ctypes.util
import errno
import fcntl
import functools
import mmap
import os
import threading
from collections.abc import Callable

import xxhash

from datacache.cache.blocks import PIECE, PieceBlock

# linux/falloc.h: free a range (FALLOC_FL_PUNCH_HOLE must be OR'ed with FALLOC_FL_KEEP_SIZE)
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02

DIRECT_ALIGN = 4096
"""Bytes: O_DIRECT offsets, lengths and buffer addresses are multiples of the device's logical
block size (512 or 4096; open(2), "O_DIRECT"), so 4096 suits both."""
DIRECT_CHUNK = 1 << 20
"""Bytes per O_DIRECT ``pwrite``, copied through a page-aligned buffer of this size per thread
(Python's ``bytes`` are not aligned)."""

MAPPED_MIN = 1 << 20
"""Bytes: a buffered write at least this long goes through a shared mapping (:func:`_write_mapped`)."""
THP_PMD_SIZE = "/sys/kernel/mm/transparent_hugepage/hpage_pmd_size"


@functools.lru_cache(maxsize=1)
def huge_folio_bytes() -> int:
    """Bytes of the page cache's PMD-sized folio (2 MiB on x86-64), read from
    :data:`THP_PMD_SIZE`; 0 when the kernel has no transparent huge pages."""
    try:
        with open(THP_PMD_SIZE) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 0

_bounce = threading.local()


def read_range(fd: int, offset: int, size: int) -> bytes:
    """Up to ``size`` bytes at ``offset`` of the open file ``fd``: shorter only at EOF (a file
    truncated behind us: the caller's checksum then finds them wrong). Raises ``OSError``."""
    data = os.pread(fd, size, offset)
    while 0 < len(data) < size:  # a short read of a regular file: a signal, or EOF
        more = os.pread(fd, size - len(data), offset + len(data))
        if not more:
            break
        data += more
    return data


@functools.cache
def _prime_malloc() -> None:
    """Free one 16 MiB buffer, once per process. glibc's malloc raises its mmap threshold to the
    largest mmap-backed chunk freed (up to 32 MiB) and its trim threshold to twice that (mallopt(3),
    M_MMAP_THRESHOLD: the dynamic threshold); with the default 128 KiB it handed every freed 4 MiB
    block back to the kernel, and the next block read faulted in 1,024 zeroed pages (warm reads of a
    512 MiB file through ``datacache://``: 4.6 GB/s before, 7.6 GB/s after). The cost: up to 32 MiB
    of freed memory kept per malloc arena. Other C libraries: a harmless allocation."""
    bytearray(16 << 20)


def read_pieces(fd: int, offset: int, size: int) -> tuple[PieceBlock, str]:
    """As :func:`read_range`, in :data:`PIECE`-byte reads for a reader: ``(the block, the xxh3-64
    hex digest of every byte read)``, each piece hashed while it is still in the CPU's cache (one
    hash of a 4 MiB block read in one go runs from memory, ~3x the cost)."""
    _prime_malloc()
    digest = xxhash.xxh3_64()  # streaming xxh3 equals the one-shot checksum() of the whole
    pieces = []
    got = 0
    while got < size:
        want = min(PIECE, size - got)
        piece = read_range(fd, offset + got, want)
        digest.update(piece)
        pieces.append(piece)
        got += len(piece)
        if len(piece) < want:
            break
    return PieceBlock(tuple(pieces)), digest.hexdigest()


def digest_range(fd: int, offset: int, size: int) -> str:
    """The xxh3-64 hex digest of the ``size`` bytes at ``offset`` of the open file ``fd`` (of fewer
    at EOF), equal to ``checksum`` of them read whole. Read through this thread's bounce buffer, a
    piece at a time, each hashed while it is in the CPU's cache. Why: a 4 MiB ``pread`` per block
    faulted in fresh memory where the FUSE daemon's malloc maps it anew (its mmap threshold is
    1 MiB, ``procmem``): the check of a 268 MB shard at its first passthrough open ran 1.4 GB/s
    against ~8 GB/s this way. Raises ``OSError``."""
    digest = xxhash.xxh3_64()
    with memoryview(_bounce_buffer()) as view:
        got = 0
        while got < size:
            done = os.preadv(fd, [view[:min(len(view), size - got)]], offset + got)
            if not done:
                break
            digest.update(view[:done])
            got += done
    return digest.hexdigest()


def write_range(path: str, offset: int, data: bytes | memoryview, mode: int, direct: bool = False,
                allocated: Callable[[], None] | None = None) -> bool:
    """Write ``data`` at ``offset`` of the file at ``path`` (created with ``mode`` if missing; the
    range before it stays a hole). With ``direct`` its :data:`DIRECT_ALIGN`-aligned part goes
    around the page cache (``O_DIRECT``, as the kernel's cachefiles writes its cache), the rest
    (a short tail) through it: a bulk load then neither evicts the page cache that readers use nor
    pays for filling it (on this project's VMs, first touches of free memory cost ~3 ms a MB).
    Returns False when ``direct`` was asked and the file system refuses ``O_DIRECT`` (EINVAL:
    ramfs, some network and FUSE file systems): the whole range is then written through the
    page cache. ``allocated`` is called once the file system has allocated the whole range
    (``statvfs`` counts it from then on) while bytes remain to be copied, if it does. Raises
    ``OSError`` (ENOSPC on a full device)."""
    view = memoryview(data).cast("B")
    aligned = len(view) - len(view) % DIRECT_ALIGN if direct and offset % DIRECT_ALIGN == 0 else 0
    refused = False
    if aligned:
        try:
            _write_direct(path, offset, view[:aligned], mode)
            view, offset = view[aligned:], offset + aligned
        except OSError as err:
            if err.errno != errno.EINVAL:
                raise
            refused = True
    if len(view) >= MAPPED_MIN and offset % mmap.PAGESIZE == 0 and _write_mapped(path, offset, view, mode, allocated):
        return not refused
    if view:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, mode)
        try:
            while view:
                done = os.pwrite(fd, view, offset)
                view, offset = view[done:], offset + done
        finally:
            os.close(fd)
    return not refused


def _write_mapped(path: str, offset: int, view: memoryview, mode: int,
                  allocated: Callable[[], None] | None = None) -> bool:
    """``view`` at ``offset`` (page-aligned) of ``path`` through a shared mapping of the range:
    its space allocated first (``fallocate``: the file grows, never shrinks; ENOSPC is raised
    here), then the bytes copied in by the kernel (:func:`_copy_into`), without the GIL.
    ``pwrite`` of buffered data holds the file's inode lock, so threads filling blocks of one cache
    file took turns: 16 threads put 800 MB in 4 MiB blocks into one file at 430-760 MB/s by
    ``pwrite``, 1,450 MB/s this way, on this project's 2-CPU VM (ext4). Returns False where the file system cannot (no
    ``fallocate``: ramfs) or the copy faulted (the file was truncated or the range punched behind
    us, a full device refused a page): the caller then ``pwrite``s the whole range, which raises
    what the device says. Raises ``OSError`` (ENOSPC)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, mode)
    try:
        if _libc_fallocate()(fd, 0, offset, len(view)) != 0:
            err = ctypes.get_errno()
            if err in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                return False
            raise OSError(err, os.strerror(err), path)
        if allocated is not None:
            allocated()
        try:
            mapped = mmap.mmap(fd, len(view), offset=offset)  # MAP_SHARED, read and write
        except (OSError, ValueError):  # truncated behind us since the fallocate
            return False
        with mapped:
            _advise_huge(mapped, offset, len(view))
            anchor = ctypes.c_char.from_buffer(mapped)  # its address; released before the unmap
            try:
                return _copy_into(ctypes.addressof(anchor), view)
            finally:
                del anchor
    finally:
        os.close(fd)


def _advise_huge(mapped: mmap.mmap, offset: int, length: int) -> None:
    """Ask for huge folios (``MADV_HUGEPAGE``) over the whole PMD-sized folios that the mapped
    range of ``length`` bytes at file ``offset`` covers (a block's tail shorter than one keeps
    4 KiB folios). Why: the faults of a plain shared mapping fill the page cache with 4 KiB
    folios, and a file read from such a page cache ran 7.6-8.5 GB/s where one written by
    ``write`` ran 9.3-10.4 (256 MiB, 1 MiB reads, this project's VM, Linux 6.18 ext4); with the
    advice, 9.3-9.5. A 15 MB Parquet file whose last 3 MB block was left out read 1 MiB ranges at
    0.92x its local copy. The fault path then reads ahead in PMD-sized folios (mm/filemap.c,
    ``do_sync_mmap_readahead``). Only whole folios: a write fault dirties its whole folio
    (``block_page_mkwrite``), so a huge one reaching past this range would allocate the
    neighbouring holes of a sparse cache file."""
    huge = huge_folio_bytes()
    if not huge:
        return
    start = -offset % huge  # bytes into the range where its first whole folio begins
    whole = (length - start) // huge * huge
    if whole > 0:
        try:
            mapped.madvise(mmap.MADV_HUGEPAGE, start, whole)
        except (OSError, AttributeError):  # THP "never", or no MADV_HUGEPAGE here: 4 KiB folios
            pass


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _PyBuffer(ctypes.Structure):
    """CPython's ``Py_buffer`` (Include/pybuffer.h), to read the address of a read-only buffer."""
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]


def _copy_into(address: int, view: memoryview) -> bool:
    """Copy ``view`` (contiguous) to ``address`` of this process with process_vm_writev(2): the
    kernel pins the destination pages and copies, so a page that cannot be faulted in (a mapped
    file truncated or hole-punched behind us, a full device's refusal) makes the call return
    short (EFAULT) where a store by the CPU (``mapped[:] = view``) was a SIGBUS that killed the
    process. Returns True when every byte was copied; False when some were not, or the call is
    refused (a seccomp profile without it: EPERM, ENOSYS)."""
    source = _PyBuffer()
    ctypes.pythonapi.PyObject_GetBuffer(ctypes.py_object(view), ctypes.byref(source), 0)  # PyBUF_SIMPLE
    try:
        local, remote = _IoVec(source.buf, source.len), _IoVec(address, source.len)
        copied = _libc_process_vm_writev()(os.getpid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        return copied == source.len
    finally:
        ctypes.pythonapi.PyBuffer_Release(ctypes.byref(source))


def _bounce_buffer() -> mmap.mmap:
    """This thread's page-aligned buffer of :data:`DIRECT_CHUNK` bytes, made at its first use and
    kept: its pages are faulted in once, not at every read or write through it."""
    bounce = getattr(_bounce, "buffer", None)
    if bounce is None:
        bounce = _bounce.buffer = mmap.mmap(-1, DIRECT_CHUNK)  # anonymous maps are page-aligned
    return bounce


def _write_direct(path: str, offset: int, view: memoryview, mode: int) -> None:
    """``view`` (a multiple of :data:`DIRECT_ALIGN` bytes) at ``offset`` (aligned) with
    ``O_DIRECT``, :data:`DIRECT_CHUNK` bytes at a time through this thread's aligned buffer."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_DIRECT, mode)
    try:
        with memoryview(_bounce_buffer()) as out:
            done = 0
            while done < len(view):
                n = min(DIRECT_CHUNK, len(view) - done)
                out[:n] = view[done:done + n]
                wrote = 0
                while wrote < n:  # a short O_DIRECT write still ends on a block boundary
                    wrote += os.pwrite(fd, out[wrote:n], offset + done + wrote)
                done += n
    finally:
        os.close(fd)


def will_need(path: str, offset: int, size: int) -> None:
    """Start the kernel's read-ahead of ``size`` bytes at ``offset`` of ``path``, without waiting."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.posix_fadvise(fd, offset, size, os.POSIX_FADV_WILLNEED)
    finally:
        os.close(fd)


@functools.cache
def _libc_fallocate():
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    fallocate = libc.fallocate
    fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    fallocate.restype = ctypes.c_int
    return fallocate


@functools.cache
def _libc_process_vm_writev():
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    writev = libc.process_vm_writev
    writev.argtypes = (ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                       ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_ulong)
    writev.restype = ctypes.c_ssize_t
    return writev


FS_IOC_GETFLAGS, FS_IOC_SETFLAGS = 0x80086601, 0x40086602  # linux/fs.h, _IOR/_IOW('f', 1/2, long)
FS_NOCOW_FL = 0x00800000  # linux/fs.h: "Do not cow file" (btrfs; chattr +C)


def copy_on_write(directory: str, enabled: bool) -> bool:
    """Mark ``directory`` so that files made in it from now on are copied on write (``enabled``)
    or overwritten in place (btrfs's NOCOW attribute, ``chattr +C``, as btrfs's documentation
    advises for databases: the index's WAL index (``index.db-shm``) is a shared mapping, and on a
    full btrfs a store into a page of it needs a new extent the file system cannot give, which
    is a SIGBUS in SQLite; in place, the page keeps the extent SQLite allocated when it grew the
    file (by ``pwrite``, which reports ENOSPC)). A directory made in a NOCOW one inherits the
    attribute: clearing it is how a directory nested in another tier's keeps copy-on-write.
    Returns False where the file system has no such attribute (ext4, xfs, tmpfs)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        flags = array.array("i", [0])
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, flags, True)
        if bool(flags[0] & FS_NOCOW_FL) == enabled:
            flags[0] ^= FS_NOCOW_FL
            fcntl.ioctl(fd, FS_IOC_SETFLAGS, flags)
        return True
    except OSError as err:
        if err.errno in (errno.ENOTTY, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS, errno.EPERM):
            return False
        raise
    finally:
        os.close(fd)


BTRFS_IOC_START_SYNC, BTRFS_IOC_WAIT_SYNC = 0x80089418, 0x40089416  # linux/btrfs.h, _IOR/_IOW(0x94, 24/22, __u64)


def commit_frees(directory: str) -> bool:
    """Have the file system of ``directory`` commit its running transaction and wait for it
    (btrfs's ``BTRFS_IOC_START_SYNC`` + ``BTRFS_IOC_WAIT_SYNC``, as ``btrfs filesystem sync``
    without writing back dirty data): btrfs shows the space of unlinked files and punched
    ranges in ``statvfs`` only once the transaction that freed it commits. True when it did;
    False where the file system has no such call (ENOTTY, EINVAL, EOPNOTSUPP) or it failed."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        transid = array.array("Q", [0])
        fcntl.ioctl(fd, BTRFS_IOC_START_SYNC, transid, True)
        fcntl.ioctl(fd, BTRFS_IOC_WAIT_SYNC, transid, False)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def punch_hole(path: str, offset: int, size: int) -> None:
    """Free the ``size`` bytes at ``offset`` of ``path`` (fallocate(2) ``FALLOC_FL_PUNCH_HOLE |
    FALLOC_FL_KEEP_SIZE``: the range then reads as zeros and holds no space; the file keeps its
    size). Raises ``OSError``: ``EOPNOTSUPP`` where the file system cannot punch holes,
    ``FileNotFoundError`` when the file is gone."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        if _libc_fallocate()(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, size) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
    finally:
        os.close(fd)
