"""The FUSE-command lifecycle of a ThinRuntime: write its config, start it, wait for the mount, stop it.

Why it is built this way:

- The command is an argv list run without a shell, so a path with spaces or shell metacharacters
  is one literal argument and runs nothing. ``$(DATACACHE_THIN_CONFIG)`` and
  ``$(DATACACHE_THIN_TARGET)`` inside an argument become the config file's path and the target
  directory (Kubernetes' ``$(VAR)`` spelling); the environment carries both too, and never the
  ``DATACACHE_SECRET_*`` values. A bare command name is looked up in this Python environment's
  ``bin`` directory first (console scripts such as ``datacache-sshfs``), then on ``PATH``.
- The config (JSON, 0600) holds the mounts, options, target path and secrets as file paths.
- The command runs detached in its own session (``datacache apply`` may exit while it serves), so
  its process group is everything it started. Its pid and kernel start time are kept in
  ``fuse.json``, so any later process can stop it without ever signalling a recycled pid.
- Ready means the kernel lists a mount at the target, or at every mount's directory below it
  (``/proc/self/mountinfo``, never a ``stat`` that could hang on a stuck daemon). The wait is
  bounded by the profile's ``mountTimeout``; a command that exits first or never mounts is
  stopped, whatever it mounted is detached, and the error names the profile, what happened, the
  end of the command's output and what to fix.
- Stop: lazy unmount (``fusermount3 -u -z``, else ``umount -l``) of everything under the target,
  then SIGTERM to the process group and SIGKILL after a grace period.
- A file lock per runtime serialises start and stop across processes.

Files, under ``$DATACACHE_HOME/runtimes/<namespace>/<name>/thin/`` (0700): ``config.json``,
``fuse.json``, ``fuse.log`` (the command's output), ``mnt/`` (the target).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from datacache import private
from datacache.errors import ResourceError
from datacache.mountinfo import canonical, lazy_unmount, mounts
from datacache.ufs.secretfiles import write_private

CONFIG_VAR, TARGET_VAR = "DATACACHE_THIN_CONFIG", "DATACACHE_THIN_TARGET"
STOP_GRACE = 5.0  # seconds between SIGTERM and SIGKILL
_CHILDREN: dict[int, subprocess.Popen] = {}  # commands this process started, reaped on stop


class FuseCommand:
    """The FUSE command of runtime ``namespace``/``name`` under ``home`` (DATACACHE_HOME); its
    files in the runtime's ``kind`` directory (``thin``; ``juicefs`` for a JuiceFSRuntime)."""

    def __init__(self, home: str, namespace: str, name: str, kind: str = "thin"):
        self.dir = os.path.join(home, "runtimes", namespace, name, kind)
        self.target = os.path.join(self.dir, "mnt")
        self.config_path = os.path.join(self.dir, "config.json")
        self._state_path = os.path.join(self.dir, "fuse.json")
        self._log_path = os.path.join(self.dir, "fuse.log")

    def mount_dir(self, path: str) -> str:
        """Where the dataset mount at namespace ``path`` (``/`` or ``/name``) appears: target + path."""
        return os.path.join(self.target, path.strip("/")).rstrip("/")

    def ensure(self, fuse, config: dict, who: str, fix: str = "") -> str:
        """Have the command of ``fuse`` (a ThinFuseCommand) serve ``config``: start it, or restart it
        when it died or its command or config changed. Returns the target directory. ``who`` names
        the runtime and profile in errors, ``fix`` what to fix (default: the profile's command). Raises ``ResourceError`` (see module docstring) within
        ``fuse.mount_timeout`` seconds plus the stop grace."""
        text = json.dumps(config, indent=2, sort_keys=True)
        digest = hashlib.sha256(json.dumps([fuse.command, text]).encode()).hexdigest()
        dirs = [m["targetPath"] for m in config["mounts"]]
        with self._locked():
            state = self._state()
            if state and state["digest"] == digest and _same_process(state) and self._ready(dirs):
                return self.target
            self._teardown(state)
            write_private(self.config_path, text)
            self._start(fuse, dirs, digest, who, fix)
        return self.target

    def running(self) -> bool:
        """True when the command is alive and its mount is there."""
        state = self._state()
        return bool(state) and _same_process(state) and self._ready(state["dirs"])

    def stop(self) -> None:
        """Unmount and stop the command (no-op when none runs); leaves no process or mount behind."""
        if os.path.isdir(self.dir):
            with self._locked():
                self._teardown(self._state())

    # -- internals -------------------------------------------------------------------------------
    def _start(self, fuse, dirs: list[str], digest: str, who: str, fix: str) -> None:
        argv = [arg.replace(f"$({CONFIG_VAR})", self.config_path).replace(f"$({TARGET_VAR})", self.target)
                for arg in fuse.command]
        argv[0] = _executable(argv[0], who)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DATACACHE_SECRET_")}
        env.update({CONFIG_VAR: self.config_path, TARGET_VAR: self.target})
        for d in [self.target, *dirs]:
            private.makedirs(d)
        with open(os.open(self._log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, private.FILE_MODE), "wb") as log:
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                        cwd=self.dir, env=env, start_new_session=True)
            except OSError as err:
                raise ResourceError(f"{who}: spec.fuse.command {argv!r} cannot be started: "
                                    f"{err.strerror or err}; give an installed executable as its first item") from None
        _CHILDREN[proc.pid] = proc
        state = {"pid": proc.pid, "start": (_proc_stat(proc.pid) or ("", 0, 0))[2], "digest": digest, "dirs": dirs}
        write_private(self._state_path, json.dumps(state))
        deadline = time.monotonic() + fuse.mount_timeout
        while not self._ready(dirs):
            code = proc.poll()
            if code is not None:
                problem = f"exited with status {code} before mounting {self.target!r}"
            elif time.monotonic() > deadline:
                problem = (f"did not mount {self.target!r} within {fuse.mount_timeout:g} s"
                           + ("" if fix else " (spec.fuse.mountTimeout)"))
            else:
                time.sleep(0.05)
                continue
            self._teardown(state)
            raise ResourceError(
                f"{who}: the FUSE command {argv!r} {problem}; its output: {self._log_tail() or '(none)'}; "
                + (fix or f"fix spec.fuse.command: it must mount the config's targetPath (the JSON file "
                          f"$({CONFIG_VAR})) and stay in the foreground until it is stopped"))

    def _ready(self, dirs: list[str]) -> bool:
        points = {entry.mountpoint for entry in mounts()}
        return canonical(self.target) in points or all(canonical(d) in points for d in dirs)

    def _teardown(self, state: dict | None) -> None:
        top = canonical(self.target)
        below = sorted((e.mountpoint for e in mounts() if e.mountpoint == top or e.mountpoint.startswith(top + "/")),
                       key=len, reverse=True)
        for point in dict.fromkeys(below):
            with contextlib.suppress(OSError):  # a mount that stays is reported by the caller's next check
                lazy_unmount(point)
        if state and _group_is_ours(state):
            _kill_group(state["pid"])
            _reap(state["pid"])
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._state_path)

    def _state(self) -> dict | None:
        try:
            with open(self._state_path, encoding="utf-8") as f:
                return json.load(f)
        except (FileNotFoundError, ValueError):
            return None

    def _log_tail(self, limit: int = 1500) -> str:
        try:
            with open(self._log_path, "rb") as f:
                f.seek(max(os.fstat(f.fileno()).st_size - limit, 0))
                text = f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""
        return " | ".join(line.strip() for line in text.splitlines() if line.strip())

    @contextlib.contextmanager
    def _locked(self):
        private.makedirs(self.dir)
        fd = os.open(os.path.join(self.dir, "lock"), os.O_RDWR | os.O_CREAT, private.FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def _executable(name: str, who: str) -> str:
    """``name`` itself when it has a '/', else its path in this environment's bin or on PATH."""
    if os.sep in name:
        return name
    found = shutil.which(name, path=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    if found is None:
        raise ResourceError(f"{who}: spec.fuse.command[0] {name!r} was not found in "
                            f"{os.path.dirname(sys.executable)} or on PATH; install it or give its absolute path")
    return found


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """``(state, process group, start time in clock ticks)`` of ``pid``, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return fields[0].decode(), int(fields[2]), int(fields[19])


def _same_process(state: dict) -> bool:
    """True when the recorded process still runs (same pid *and* start time, not a zombie)."""
    stat = _proc_stat(state["pid"])
    return stat is not None and stat[0] != "Z" and stat[2] == state["start"]


def _group_is_ours(state: dict) -> bool:
    """True unless the recorded pid now belongs to another process. While any member of our group
    lives, the kernel does not reuse its id (the leader's pid), so a gone leader is safe too."""
    stat = _proc_stat(state["pid"])
    return stat is None or stat[2] == state["start"]


def _group_alive(pgid: int) -> bool:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _proc_stat(int(entry))
            if stat is not None and stat[1] == pgid and stat[0] != "Z":
                return True
    return False


def _kill_group(pgid: int) -> None:
    """SIGTERM the process group, SIGKILL it after :data:`STOP_GRACE` seconds; returns once it is gone."""
    for sig, grace in ((signal.SIGTERM, STOP_GRACE), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            _reap(pgid)
            if not _group_alive(pgid):
                return
            time.sleep(0.05)


def _reap(pid: int) -> None:
    proc = _CHILDREN.get(pid)
    if proc is not None and proc.poll() is not None:
        del _CHILDREN[pid]
