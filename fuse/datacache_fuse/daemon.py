"""One FUSE daemon process: open the dataset, mount it, serve requests, clean up.

Order, and why:

1. Open the dataset first (``Embedded.open_dataset``): a missing Dataset or CacheRuntime is
   reported before anything is mounted, and the manifest is loaded (or synced) once.
2. Prepare the mount point (:func:`prepare_mountpoint`): a dead mount left by a killed daemon is
   lazily unmounted (case C11), a live one is refused, a missing directory is created.
3. datacache's own FUSE transport (:mod:`datacache_fuse.kernel`, no libfuse) mounts (read-only,
   ``default_permissions``, ``fsname=datacache:NS/NAME``, type ``fuse.datacache``; ``mount(2)``
   as root, ``fusermount3`` otherwise); once the kernel's INIT is answered the bdi read-ahead is
   widened to 1 MiB (see :mod:`datacache.mountinfo`). The handlers (:mod:`.kernel_ops`) run on
   the session's worker threads.
4. Serving ends when the mount goes away (``datacache unmount``: a lazy unmount ends the session
   once the last open file is closed) or on SIGTERM/SIGINT/SIGHUP, which unmount (lazily) and
   exit 0.

Memory: the daemon fixes glibc's mmap threshold and caps its arenas before its threads start
(:func:`datacache.procmem.bound_malloc`), and hands freed heap memory back (``malloc_trim``) once
a burst of reads is over (no fill in flight for ``TRIM_IDLE_S`` after requests came), so it
peaks within the read-ahead budget plus a fixed overhead and returns near its start when idle.

A state file ``$DATACACHE_HOME/run/fuse/<hash>.json`` (pid, dataset, mount point, log file) lives
while the daemon does, so ``unmount`` and supervisors can find the daemon. The log goes to
``$DATACACHE_HOME/logs/fuse-<namespace>-<dataset>-<hash>.log``; it names paths and errors, never
option values of mounts or secrets (the core redacts secrets from UFS errors).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Callable, Iterable

from datacache import mountinfo, procmem
from datacache.api.quantity import format_bytes
from datacache.mountinfo import MountState
from datacache.stack import layout

log = logging.getLogger("datacache_fuse")

READ_AHEAD_KIB = 1024  # bdi read_ahead_kb: 1 MiB kernel read requests
WORKERS = 16  # threads serving requests, per daemon
# Mount option (libfuse 3.18's name) asking for FUSE over io_uring: used when the kernel offers it,
# i.e. with the fuse module parameter enable_uring on (see datacache_fuse.kernel.ring_queue).
IO_URING = "io_uring"
TRIM_IDLE_S = 1.0  # seconds without a fill in flight after requests before free memory is handed back
PASSTHROUGH_MIN_BYTES = 4 << 20  # files from this size on count as large when choosing the read mode
WATCH_PID_ENV = "DATACACHE_FUSE_WATCH_PID"  # a harness's pid: its exit ends the daemon (test runners set it)


class MountError(Exception):
    """The dataset could not be mounted at the mount point (message says why and what to do)."""


# -- files of a mount ----------------------------------------------------------------------------
def log_path(home: str, dataset: str, namespace: str, mountpoint: str) -> str:
    """The daemon's log file for this mount (under ``home/logs``)."""
    return os.path.join(home, "logs", f"fuse-{namespace}-{dataset}-{layout.mount_key(mountpoint)}.log")


def state_path(home: str, mountpoint: str) -> str:
    """The state file of the daemon serving ``mountpoint`` (under ``home/run/fuse``)."""
    return layout.fuse_state_path(home, mountpoint)


def read_state(home: str, mountpoint: str) -> dict | None:
    """``{"pid", "dataset", "namespace", "mountpoint", "log", "started", "readMode"}`` of the
    daemon serving ``mountpoint`` (``readMode``: the :func:`read_mode_line`), or None when there
    is none (or it is gone)."""
    try:
        with open(state_path(home, mountpoint), encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError):
        return None
    return state if _alive(state.get("pid")) else None


def _alive(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def ensure_private_dir(path: str) -> str:
    """Create ``path`` and any missing parents with mode 0700 (``os.makedirs`` applies its mode
    to the last component only)."""
    missing = []
    while path and not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
    return missing[0] if missing else path


def _write_state(path: str, state: dict) -> None:
    ensure_private_dir(os.path.dirname(path))
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(fd, "w", encoding="utf-8") as f:
        json.dump(state, f)
    os.replace(tmp, path)


def _remove_state(path: str) -> None:
    try:
        with open(path, encoding="utf-8") as f:
            if json.load(f).get("pid") != os.getpid():
                return  # a newer daemon owns it
        os.unlink(path)
    except (OSError, ValueError):
        pass


def setup_logging(path: str, debug: bool = False, stderr: bool = True) -> None:
    """Log to ``path`` (0600, appended) and, when ``stderr``, warnings (everything with
    ``debug``) to stderr too."""
    ensure_private_dir(os.path.dirname(path))
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    fmt = logging.Formatter("%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    fh = logging.FileHandler(path, encoding="utf-8")
    fh.setFormatter(fmt)
    root.addHandler(fh)
    if stderr and not _same_file(sys.stderr, path):  # a background daemon's stderr is the log
        sh = logging.StreamHandler(sys.stderr)
        sh.setFormatter(fmt)
        sh.setLevel(logging.DEBUG if debug else logging.WARNING)
        root.addHandler(sh)
    root.setLevel(logging.DEBUG if debug else logging.WARNING)
    logging.getLogger("datacache_fuse").setLevel(logging.DEBUG if debug else logging.INFO)
    # a warmup nobody asked for by name says when it starts and ends (datacache.scan_warmup)
    logging.getLogger("datacache.scan_warmup").setLevel(logging.DEBUG if debug else logging.INFO)


def choose_read_mode(client) -> tuple[bool, str]:
    """``(handles, why)`` for a dataset (a DatasetClient): a file handle per open, with complete
    file versions passed through to the kernel, when files larger than
    ``max(PASSTHROUGH_MIN_BYTES, block size)`` hold at least half of its bytes (large files: reads
    at the local disk's speed, the three round trips of an OPEN cost little next to them); else the
    no-open mode (trees of small files: a warm epoch never reaches the daemon)."""
    manifest = client.manifest
    large_from = max(PASSTHROUGH_MIN_BYTES, client.block_size)
    total = manifest.total_size
    large = manifest.bytes_in_files_over(large_from)
    share = f"{100 * large // total if total else 0}% of {format_bytes(total)} in files over {format_bytes(large_from)}"
    return (total > 0 and 2 * large >= total), share


def read_mode_line(handles: bool, why: str) -> str:
    """What a mount tells the user about its read mode, in plain words: the mode, what it is good
    for, and why it was chosen (``why``: the share of large files, or ``"as asked"``), naming the
    other ``--read-mode`` when the choice was automatic."""
    if handles:
        line = "passthrough: the kernel reads complete cached files directly, best for large files"
        other = "--read-mode no-open suits a tree of small files"
    else:
        line = "no-open: opening a file costs no request to the daemon, best for many small files"
        other = "--read-mode passthrough suits large files"
    return f"{line} ({why})" if why == "as asked" else f"{line} ({why}; {other})"


def _watched_pid() -> int | None:
    """The pid in ``$DATACACHE_FUSE_WATCH_PID``, whose exit ends the daemon (unmounting), or None.
    Raises :class:`MountError` for a value that is not a pid."""
    value = os.environ.get(WATCH_PID_ENV)
    if not value:
        return None
    if not value.isdigit():
        raise MountError(f"{WATCH_PID_ENV}={value!r} is not a process id: unset it or give a pid")
    return int(value)


def _same_file(stream, path: str) -> bool:
    try:
        a, b = os.fstat(stream.fileno()), os.stat(path)
    except (OSError, ValueError, AttributeError):
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


# -- mounting ------------------------------------------------------------------------------------
def mount_options(dataset: str, namespace: str, runtime_options: dict | None = None,
                  extra: Iterable[str] = ()) -> set[str]:
    """Mount options: ``ro``, ``default_permissions``, ``fsname=datacache:NS/NAME``,
    ``subtype=datacache``, then the runtime's ``fuse.options`` (name -> value; ``""``/``"true"``
    means a bare flag) and ``extra`` (``-o`` values, comma lists allowed). ``rw`` is ignored: the
    mount is read-only."""
    opts = {"ro", "default_permissions", f"fsname=datacache:{namespace}/{dataset}", "subtype=datacache"}
    for name, value in (runtime_options or {}).items():
        opts.add(name if str(value).lower() in ("", "true") else f"{name}={value}")
    for item in extra:
        opts.update(o.strip() for o in item.split(",") if o.strip())
    opts.discard("rw")
    bad = sorted(o for o in opts if o.split("=", 1)[0] == "max_read")
    if bad:
        raise MountError(f"mount option {bad[0]} is not supported: the kernel's read request size "
                         "follows the read-ahead window, which the daemon sets to 1 MiB; drop the option")
    return opts


def check_empty(mountpoint: str) -> None:
    """Raise :class:`MountError` when ``mountpoint`` is a directory with entries: a mount would
    hide them (the kernel does not refuse, as libfuse 2 did without ``nonempty``). A missing path
    or a non-directory passes (other checks name those)."""
    try:
        with os.scandir(mountpoint) as it:
            if next(it, None) is None:
                return
    except (FileNotFoundError, NotADirectoryError):
        return
    raise MountError(f"{mountpoint} is not empty: a mount would hide its files; use an empty directory, "
                     f"or pass --allow-nonempty to mount over them")


def prepare_mountpoint(mountpoint: str, probe_timeout: float = 5.0, allow_nonempty: bool = False) -> None:
    """Make ``mountpoint`` ready to be mounted on (case C11).

    A dead FUSE mount (its daemon was killed: ENOTCONN) is lazily unmounted; a missing directory
    is created. Raises :class:`MountError` when a live FUSE mount is already there, when an old
    mount does not answer within ``probe_timeout`` seconds, when the path is not a directory, or
    when it is a directory with entries and not ``allow_nonempty``.
    """
    state = mountinfo.probe(mountpoint, probe_timeout)
    if state is MountState.DEAD:
        log.warning("%s: found a dead FUSE mount (its daemon is gone); unmounting it lazily", mountpoint)
        try:
            mountinfo.lazy_unmount(mountpoint)
        except mountinfo.UnmountError as err:
            raise MountError(f"{mountpoint}: a dead mount is in the way and could not be removed: {err}") from None
    elif state is MountState.LIVE:
        top = mountinfo.mounted_at(mountpoint)
        raise MountError(f"{mountpoint} is already mounted ({top.source if top else 'FUSE'}): "
                         f"run 'datacache unmount {mountpoint}' first")
    elif state is MountState.HUNG:
        raise MountError(f"{mountpoint}: a FUSE mount there does not answer; run "
                         f"'datacache unmount {mountpoint}' (lazy) and retry")
    make_mountpoint(mountpoint)
    if not allow_nonempty:
        check_empty(mountpoint)


def make_mountpoint(mountpoint: str) -> bool:
    """Create ``mountpoint`` (with its parents) unless it is a directory already; True when it
    was created. Raises :class:`MountError` in one line naming the path in the way and the fix: a path under
    a regular file, a directory that cannot be made (``/proc``, read-only, no permission)."""
    existed = os.path.isdir(mountpoint)
    try:
        os.makedirs(mountpoint, mode=0o700, exist_ok=True)
        if not existed:
            os.chmod(mountpoint, 0o700)  # whatever the umask: only its owner sees it unmounted
    except OSError as err:
        blocker = _first_non_directory(mountpoint)
        if blocker == mountpoint:
            raise MountError(f"{mountpoint} exists and is not a directory: give an empty directory as the "
                             "mount point (or a path to create)") from None
        if blocker is not None:
            raise MountError(f"cannot create mount point {mountpoint}: {blocker} is a file, not a directory; "
                             "give a path under a directory (e.g. /mnt/NAME)") from None
        where = f": {err.filename}" if err.filename and err.filename != mountpoint else ""
        raise MountError(f"cannot create mount point {mountpoint}: {err.strerror or err}{where}; give a path "
                         "under a directory you can write to (e.g. /mnt/NAME), or create it first") from None
    if not os.path.isdir(mountpoint):
        raise MountError(f"{mountpoint} is not a directory")
    return not existed


class _IdleTrim:
    """Calls :func:`datacache.procmem.trim` once per burst: when requests came since the last
    trim and no fill has held the memory budget ``budget`` for ``TRIM_IDLE_S`` seconds."""

    def __init__(self, session, budget):
        self._session, self._budget = session, budget
        self._seen = self._total()
        self._quiet_since = time.monotonic()
        self._pending = False  # requests came since the last trim

    def _total(self) -> int:
        return sum(self._session.counts().values())

    def tick(self) -> None:
        """Called every 0.2 s by the serving loop."""
        now, total = time.monotonic(), self._total()
        if total != self._seen or self._budget.used:
            self._seen, self._quiet_since, self._pending = total, now, True
        elif self._pending and now - self._quiet_since >= TRIM_IDLE_S:
            procmem.trim()
            self._pending = False


def _first_non_directory(path: str) -> str | None:
    """The nearest of ``path`` and its ancestors that exists and is not a directory, if any."""
    while path and path != os.path.dirname(path):
        if os.path.lexists(path):
            return None if os.path.isdir(path) else path
        path = os.path.dirname(path)
    return None


def serve(dataset: str, mountpoint: str, *, namespace: str = "default", home: str | None = None,
          options: Iterable[str] = (), debug: bool = False, stderr: bool = True,
          read_ahead_kib: int = READ_AHEAD_KIB, workers: int = WORKERS, allow_nonempty: bool = False,
          no_open: bool | None = None, announce: Callable[[str], None] | None = None,
          record: str | None = None) -> None:
    """Mount ``namespace/dataset`` at ``mountpoint`` and serve it until unmounted or signalled.

    Blocks. ``home``: DATACACHE_HOME (default from the environment); ``options``: extra ``-o``
    mount options; ``read_ahead_kib``: the bdi read-ahead (KiB, 0 leaves the kernel's default);
    ``workers``: threads serving requests; ``allow_nonempty``: mount over a directory
    with entries; ``no_open``: True for the kernel's no-open mode, False for a file handle per
    open with complete cached files passed through to the kernel, None to choose by what the dataset
    holds (:func:`choose_read_mode`, logged)
    (handlers in :mod:`.kernel_ops`, transport in :mod:`datacache_fuse.kernel`); ``announce``:
    called once the kernel's INIT came (the mount answers) with one line for the user,
    ``mounted NS/DATASET at PATH (read-only, mode, cache levels), Ctrl-C to unmount``;
    ``record``: a run name under which the files read are written to the dataset's access trace
    (:mod:`datacache.plan.trace`; a file served by the kernel's page cache or passed through
    to it without a read reaching the daemon is not seen).
    Raises ``datacache.errors.ResourceError`` (no such
    dataset / runtime) or :class:`MountError` (also when the session ends while still mounted,
    e.g. the kernel refused the INIT handshake); returns normally after an unmount or a signal.
    """
    from datacache.control.embedded import read_path
    from datacache.state import default_home

    home = os.path.abspath(home or default_home())
    mountpoint = mountinfo.canonical(mountpoint)
    logfile = log_path(home, dataset, namespace, mountpoint)
    setup_logging(logfile, debug=debug, stderr=stderr)
    procmem.bound_malloc()  # before any worker or fill thread exists (arenas are made per thread)
    log.info("mounting %s/%s at %s (pid %d)", namespace, dataset, mountpoint, os.getpid())

    paths = read_path(home)
    client = None
    try:
        runtime = paths.runtime_for(paths.get("Dataset", dataset, namespace))
        client = paths.open_dataset(dataset, namespace)  # ResourceError without a runtime
        if record:
            from datacache.stack.plans import recorder

            client.on_read(recorder(home, dataset, namespace, record))
        fuse_spec = runtime.spec.fuse
        opts = mount_options(dataset, namespace, fuse_spec.options, options)
        prepare_mountpoint(mountpoint, allow_nonempty=allow_nonempty)
        cache = " + ".join(f"{level.mediumtype} {format_bytes(level.quota_bytes)}"
                           for level in runtime.spec.tieredstore.ordered_levels)

        handles, why = (no_open is False, "as asked") if no_open is not None else choose_read_mode(client)
        mode_line = read_mode_line(handles, why)
        log.info("read mode: %s", mode_line)

        def mounted(mode: str) -> None:
            if announce is not None:
                announce(f"mounted {namespace}/{dataset} at {mountpoint} (read-only, {mode}, cache {cache}), "
                         f"Ctrl-C to unmount\nread mode: {mode_line}")

        _serve(client, namespace, dataset, mountpoint, opts, home, logfile, attr_timeout=fuse_spec.attr_timeout,
               workers=workers, read_ahead_kib=read_ahead_kib, handles=handles, mounted=mounted,
               mode_line=mode_line)
    finally:
        if client is not None:
            client.close()
        paths.close()
        # last: `datacache unmount` waits for it to go, and reports the daemon exited then
        _remove_state(state_path(home, mountpoint))


def _serve(client, namespace: str, dataset: str, mountpoint: str, opts: set[str], home: str, logfile: str, *,
           attr_timeout: float, workers: int, read_ahead_kib: int, handles: bool,
           mounted: Callable[[str], None], mode_line: str) -> None:
    """Mount, serve until unmounted or signalled (SIGTERM, SIGINT, SIGHUP unmount lazily and end
    the daemon), clean up. Options other than the ones the transport sets itself (``ro``,
    ``default_permissions``, ``fsname``, ``subtype``, ``allow_other``) go to the kernel as they
    are. ``handles``: an OPEN per file, passed through when it is held whole (``DatasetClient.local_file``); ``mounted``:
    called with the mode (``"no-open mode"``, ``"a file handle per open"``) once the mount
    answers; ``mode_line``: the :func:`read_mode_line`, kept in the state file for the
    background launcher to print. With ``$DATACACHE_FUSE_WATCH_PID`` set, the exit of that process unmounts and ends
    the daemon too (a killed test runner leaves no mount behind, issue 19.17)."""
    from datacache_fuse.kernel.mount import FuseMountError
    from datacache_fuse.kernel.server import FuseServer
    from datacache_fuse.kernel_ops import DatasetOperations

    own = {"ro", "default_permissions", "allow_other", IO_URING}
    extra = tuple(sorted(o for o in opts if o not in own and not o.startswith(("fsname=", "subtype="))))
    ops = DatasetOperations(client, attr_timeout=attr_timeout, no_open=not handles, passthrough=handles)
    server = FuseServer(ops, mountpoint, fsname=f"datacache:{namespace}/{dataset}", workers=workers,
                        passthrough=handles, allow_other="allow_other" in opts, options=extra,
                        read_ahead_kib=read_ahead_kib, uring=IO_URING in opts)
    stop = threading.Event()
    signalled: list[str] = []

    def on_signal(signum, frame) -> None:
        signalled.append(signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    watched = _watched_pid()
    # Written before the mount answers: whoever sees the mount live (the background launcher,
    # then 'datacache unmount') finds its daemon.
    state_file = state_path(home, mountpoint)
    _write_state(state_file, {"pid": os.getpid(), "dataset": dataset, "namespace": namespace,
                              "mountpoint": mountpoint, "log": logfile,
                              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "readMode": mode_line})
    try:
        session = server.start()
    except FuseMountError as err:
        with contextlib.suppress(OSError):
            os.unlink(state_file)
        raise MountError(f"cannot mount at {mountpoint}: {err.strerror} (is /dev/fuse there, and fusermount3 "
                         f"installed? see {logfile})") from None
    ours = mountinfo.mounted_at(mountpoint)  # this session's mount (its dev tells it from later ones)
    try:
        os.chdir("/")  # do not pin the caller's working directory
        mode = "no-open mode" if ops.no_open else "a file handle per open"
        log.info("mounted %s/%s at %s (FUSE 7.%d, %s, options %s)", namespace, dataset, mountpoint,
                 session.kernel.minor, mode + (", passthrough of complete cached files" if session.passthrough else ""),
                 ",".join(extra) or "-")
        mounted(mode)
        idle = _IdleTrim(session, client.source.readahead.budget)
        while not session.wait(0.2) and not stop.is_set():
            if watched is not None and not _alive(watched):
                signalled.append(f"exit of process {watched} ({WATCH_PID_ENV})")
                break
            idle.tick()
        if signalled:
            log.info("%s received: unmounting", signalled[0])
        else:
            top = mountinfo.mounted_at(mountpoint)
            if top is not None and ours is not None and top.dev == ours.dev:
                raise MountError(f"the FUSE session at {mountpoint} ended while still mounted; see {logfile}")
    finally:
        open_files = ops.open_files
        if not server.stop(timeout=2.0):  # files still open elsewhere: they get ENOTCONN when we exit
            server.session.close()
        counts, fast = session.counts(), session.backing.fast
        log.info("%s: session ended (%d files were open); requests: %s; backing files registered: %d; "
                 "opens passed through: %d (reopens answered by the compiled loop: %d, of which the read "
                 "listeners missed %d); held-up requests whose reading turn was handed off: %d", mountpoint,
                 open_files, ", ".join(f"{getattr(op, 'name', op)} {n}" for op, n in counts.most_common()),
                 session.backing.registered, session.passed_through, fast.opens if fast is not None else 0,
                 fast.lost if fast is not None else 0, session.gate.handoffs if session.gate else 0)
