"""Starting, supervising and stopping FUSE daemons (``--background``, ``--restart``, unmount).

- ``--background``: the daemon is a detached child (``python -m datacache_fuse mount ...`` in a
  new session, stdin closed, output appended to its log file, cwd ``/``), and the caller returns
  only once the mount point is a *live* FUSE mount, bounded by a timeout; if the child exits or the
  time runs out, the error carries the end of the log. A daemon that fork()s itself would have to
  do this handshake through a pipe; a child process plus polling the kernel's answer is simpler and
  checks the one thing that matters (the mount answers).
- ``--restart``: a supervisor process runs the daemon as its child and re-runs it when it dies
  leaving a dead mount behind (ENOTCONN); the new daemon lazily unmounts the corpse itself (case
  C11). A daemon that ends cleanly (unmounted, or SIGTERM) ends the supervisor. Restarts back off
  (0.5 s doubling to 10 s) and stop after ``max_restarts`` within ``window`` seconds, so a daemon
  that cannot stay up does not spin.
- :func:`unmount`: lazy unmount (works while files are open elsewhere), then waits a little for
  the daemon to exit.
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import subprocess
import sys
import time

from datacache import mountinfo
from datacache_fuse.daemon import MountError, ensure_private_dir, read_state
from datacache.mountinfo import MountState

log = logging.getLogger("datacache_fuse")


def daemon_argv(dataset: str, mountpoint: str, *, namespace: str, home: str, options=(),
                debug: bool = False, restart: bool = False, allow_nonempty: bool = False,
                read_mode: str = "auto", record: str | None = None) -> list[str]:
    """The command line of a foreground daemon (or, with ``restart``, of a supervisor)."""
    argv = [sys.executable, "-m", "datacache_fuse", "mount", dataset, mountpoint,
            "--namespace", namespace, "--home", home]
    for opt in options:
        argv += ["-o", opt]
    if debug:
        argv.append("--debug")
    if allow_nonempty:
        argv.append("--allow-nonempty")
    argv += ["--read-mode", read_mode]
    if record:
        argv.append(f"--record={record}")
    if restart:
        argv.append("--restart")
    return argv


def log_tail(path: str, nbytes: int = 3000) -> str:
    """The last ``nbytes`` of a log file ("" when unreadable)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - nbytes))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def start_background(argv: list[str], mountpoint: str, logfile: str, timeout: float = 60.0) -> int:
    """Start ``argv`` detached and wait until ``mountpoint`` is a live FUSE mount.

    ``timeout``: seconds. Returns the child's pid. Raises :class:`MountError` (with the log's tail)
    when the child exits first or the mount does not answer in time (the child is then stopped).
    """
    ensure_private_dir(os.path.dirname(logfile))
    fd = os.open(logfile, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, cwd="/",
                                start_new_session=True, close_fds=True)
    finally:
        os.close(fd)
    deadline = time.monotonic() + timeout
    while True:
        rc = proc.poll()
        if rc is not None:
            raise MountError(f"the FUSE daemon exited (code {rc}) before {mountpoint} was mounted; "
                             f"{logfile} ends with:\n{log_tail(logfile)}")
        if mountinfo.probe(mountpoint, 2.0) is MountState.LIVE:
            return proc.pid
        if time.monotonic() > deadline:
            _stop(proc)
            raise MountError(f"{mountpoint} was not mounted within {timeout:.0f} s; {logfile} ends with:\n"
                             f"{log_tail(logfile)}")
        time.sleep(0.05)


def _stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    try:
        proc.terminate()
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def supervise(argv: list[str], mountpoint: str, *, max_restarts: int = 10, window: float = 60.0) -> int:
    """Run the daemon ``argv`` and run it again whenever it dies leaving a dead mount at
    ``mountpoint``. Returns the daemon's last exit code (0 after a clean unmount).

    SIGTERM/SIGINT/SIGHUP are passed on to the daemon (which unmounts) and end supervision. At
    most ``max_restarts`` restarts within ``window`` seconds; then the dead mount is removed and 1
    is returned.
    """
    state = {"child": None, "stopping": False}

    def on_signal(signum, _frame):
        state["stopping"] = True
        child = state["child"]
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    restarts: collections.deque[float] = collections.deque()
    delay = 0.5
    while True:
        started = time.monotonic()
        child = state["child"] = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        log.info("supervisor %d: daemon pid %d serving %s", os.getpid(), child.pid, mountpoint)
        rc = child.wait()
        if state["stopping"]:
            return rc
        if mountinfo.probe(mountpoint, 5.0) is not MountState.DEAD:
            log.info("supervisor: daemon exited (code %s) and %s is not mounted: done", rc, mountpoint)
            return rc
        now = time.monotonic()
        while restarts and now - restarts[0] > window:
            restarts.popleft()
        if len(restarts) >= max_restarts:
            log.error("supervisor: the daemon died %d times within %.0f s; giving up", len(restarts) + 1, window)
            try:
                mountinfo.lazy_unmount(mountpoint)
            except mountinfo.UnmountError as err:
                log.error("supervisor: %s", err)
            return 1
        restarts.append(now)
        if now - started > window:
            delay = 0.5
        log.warning("supervisor: daemon pid %d died (code %s) leaving a dead mount at %s; re-mounting in %.1f s",
                    child.pid, rc, mountpoint, delay)
        time.sleep(delay)
        delay = min(delay * 2, 10.0)
        if state["stopping"]:
            return rc


def unmount(mountpoint: str, home: str | None = None, wait: float = 5.0) -> str:
    """Lazily unmount the datacache mount at ``mountpoint`` (works while files are open elsewhere;
    a dead mount is removed too), then wait up to ``wait`` seconds for its daemon to exit, unless
    other processes still use the mount (:func:`mountinfo.users`): then it returns at once.

    Returns a one-line report. Raises :class:`MountError` when nothing (or no FUSE file system) is
    mounted there, or :class:`mountinfo.UnmountError` when the kernel refuses.
    """
    from datacache.state import default_home

    home = os.path.abspath(home or default_home())
    mountpoint = mountinfo.canonical(mountpoint)
    top = mountinfo.mounted_at(mountpoint)
    if top is None:
        if not os.path.lexists(mountpoint):
            raise MountError(f"{mountpoint} does not exist: give the directory a dataset is mounted at "
                             "('findmnt -t fuse.datacache' lists them)")
        raise MountError(f"{mountpoint} is not mounted")
    if not top.is_fuse:
        raise MountError(f"{mountpoint} is a {top.fstype} mount, not a FUSE mount: not unmounting it")
    daemon = read_state(home, mountpoint)
    busy = [p for p in mountinfo.users(top) if daemon is None or p != daemon["pid"]]
    mountinfo.lazy_unmount(mountpoint)
    if daemon is None:
        return f"unmounted {mountpoint}"
    pid = daemon["pid"]
    if busy:  # no use waiting: the daemon serves them until they close their files
        shown = ", ".join(map(str, busy[:5])) + (", ..." if len(busy) > 5 else "")
        return (f"unmounted {mountpoint}; daemon {pid} keeps serving files still open in {len(busy)} "
                f"process(es) (pid {shown}) and exits when they are closed")
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if read_state(home, mountpoint) is None:
            return f"unmounted {mountpoint} (daemon {pid} exited)"
        time.sleep(0.05)
    return (f"unmounted {mountpoint}; daemon {pid} keeps serving files that are still open and exits "
            f"when they are closed")
