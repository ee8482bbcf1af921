"""Keeping a long-lived process's memory near what it holds: glibc malloc settings and RSS figures.

Blocks are large (4 MiB by default) and are allocated and freed by many threads. glibc's malloc
then keeps freed memory instead of handing it back (mallopt(3)):

- its *dynamic* mmap threshold rises to the size of the largest mmap-backed chunk freed (up to
  32 MiB), so after the first block is freed every later block comes from a heap, where freed
  blocks stay resident, fragmented between live ones;
- each thread may get an arena of its own (up to 8 per CPU), each keeping its own free memory.

Measured (``benchmarks.memory``: 64 readers of cold 32 MiB files over HTTP through the FUSE
daemon, 256 MiB budget): the daemon peaked 401 MiB over its start and kept it when idle; with a
fixed 1 MiB threshold, 2 arenas and a trim after each burst, 298 MiB and 54 MiB. :func:`bound_malloc`
sets both, once, in the process that streams blocks for a long time (the FUSE daemon);
``datacache warmup``, which exits when done, keeps its freed blocks for the next ones instead
(:func:`keep_blocks_malloc`); a reader process (``datacache://``) keeps glibc's defaults, which serve
warm reads faster (see ``cache.disk._prime_malloc``). The environment's ``MALLOC_ARENA_MAX`` and
``MALLOC_MMAP_THRESHOLD_`` win when set. Other C libraries: nothing is changed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os

MMAP_THRESHOLD = 1 << 20  # bytes: larger allocations are mmap-backed, unmapped when freed
ARENAS = 2  # malloc arenas at most: the GIL runs one thread's Python at a time anyway
OVERHEAD = 96 << 20
"""Bytes a daemon or warmup process may hold past its start and the read-ahead budget at its peak
(the README's figure): blocks being answered by worker threads, a network body's chunks while
they are joined, thread stacks, allocator slack. ``benchmarks.memory`` measures it."""
WARMUP_MMAP_THRESHOLD = 32 << 20  # bytes: a warmup's blocks come from heaps (keep_blocks_malloc)
WARMUP_TRIM_THRESHOLD = 1 << 30  # bytes of free heap a warmup keeps (keep_blocks_malloc)
_M_TRIM_THRESHOLD = -1  # <malloc.h>
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


@functools.cache
def _libc():
    """glibc's handle, or None (musl, macOS: no mallopt settings of this kind)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018  (glibc only)
        return libc
    except (OSError, AttributeError):
        return None


def bound_malloc(mmap_threshold: int = MMAP_THRESHOLD, arenas: int = ARENAS) -> bool:
    """Fix glibc's mmap threshold at ``mmap_threshold`` bytes (no dynamic raise) and cap its
    arenas at ``arenas``, unless the environment sets them. Call before the threads that
    allocate blocks start (arenas are made per thread). True when glibc took the settings."""
    return _mallopt((("MALLOC_MMAP_THRESHOLD_", _M_MMAP_THRESHOLD, mmap_threshold),
                     ("MALLOC_ARENA_MAX", _M_ARENA_MAX, arenas)))


def keep_blocks_malloc(arenas: int = ARENAS) -> bool:
    """For a process that loads blocks and then exits (``datacache warmup``): blocks come from
    at most ``arenas`` malloc heaps (mmap threshold :data:`WARMUP_MMAP_THRESHOLD`) that keep
    freed memory (trim threshold :data:`WARMUP_TRIM_THRESHOLD`), so the next segment's buffers
    reuse pages already faulted in; the process's peak is what its read-ahead budget lets it hold
    at once either way, and all of it goes at exit. Measured (56 x 8 MiB from S3 behind the
    delay proxy, 16 segments in flight, this project's 2-CPU VM, runs interleaved): with
    :func:`bound_malloc`'s 1 MiB threshold every 4 MiB buffer was a fresh mapping, 87-97k minor
    faults and 1.77-2.29 s; kept, 19-24k faults and 1.57-2.0 s, peak RSS 217-237 MiB against
    204-208. ``benchmarks.memory``'s 1.5 GiB warmup peaked +257-267 MiB over its start against
    +236 (the README's bound: +352). The environment's ``MALLOC_*`` settings win when set. Call
    before the segment threads start. True when glibc took the settings."""
    return _mallopt((("MALLOC_MMAP_THRESHOLD_", _M_MMAP_THRESHOLD, WARMUP_MMAP_THRESHOLD),
                     ("MALLOC_TRIM_THRESHOLD_", _M_TRIM_THRESHOLD, WARMUP_TRIM_THRESHOLD),
                     ("MALLOC_ARENA_MAX", _M_ARENA_MAX, arenas)))


def freeze_gc() -> int:
    """Move every object alive now (the imported modules, a UFS client's service models) into
    the garbage collector's permanent generation (``gc.freeze``, Python 3.7+), so the full
    collections that a bulk load's short-lived objects trigger stop traversing them again; a
    frozen object that becomes garbage stays until exit, which a process that exits when done
    (``datacache warmup``) does not notice. Measured (56 x 8 MiB from S3 behind the delay proxy,
    this project's 2-CPU VM, three pairs interleaved): 1.68-1.78 s against 1.78-1.90 s unfrozen.
    Returns the number of objects frozen."""
    gc.freeze()
    return gc.get_freeze_count()


def _mallopt(settings) -> bool:
    """``mallopt`` each ``(environment variable, option, value)`` whose variable is unset; True
    when glibc took them all (False too where the C library is not glibc)."""
    libc = _libc()
    if libc is None:
        return False
    ok = True
    for name, option, value in settings:
        if name not in os.environ:
            ok = bool(libc.mallopt(option, value)) and ok
    return ok


def trim() -> None:
    """Hand free heap memory back to the kernel (``malloc_trim(0)``, every arena); glibc only."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def rss_mib(pid: int | str = "self") -> tuple[float, float]:
    """``(current, peak)`` resident set size of process ``pid`` in MiB (``VmRSS``, ``VmHWM`` of
    ``/proc/PID/status``). Raises ``OSError``: ``FileNotFoundError`` when it is gone,
    ``ProcessLookupError`` when it has exited and is not reaped yet (no memory left to show)."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if line.startswith(("VmRSS:", "VmHWM:")))
    if len(fields) < 2:
        raise ProcessLookupError(f"process {pid} has exited")
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024
