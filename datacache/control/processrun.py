"""Running a DataProcess on the embedded host: the Dataset mounted read-only through datacache's
own FUSE mount at ``spec.mountPath`` (the ``datacache mount --background`` command: the core
never imports the FUSE package), the command as a local process (its own session, so a timeout
or a cancel stops all it started), its output in a log file, the mount removed afterwards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque

from datacache import private
from datacache.api.dataflow import DataProcess
from datacache.control import flowstatus
from datacache.errors import DatacacheError, describe_error
from datacache.state import now_iso
from datacache.ufs.credentials import SECRET_ENV_PREFIX

MOUNT_TIMEOUT_S = 120.0
STOP_GRACE_S = 5.0  # seconds between SIGTERM and SIGKILL of a command that must stop


def log_path(home: str, namespace: str, name: str) -> str:
    """Where a DataProcess's output goes: ``$DATACACHE_HOME/logs/dataprocess/<ns>/<name>.log``."""
    return os.path.join(home, "logs", "dataprocess", namespace, f"{name}.log")


def _datacache(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "datacache", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def _tail(path: str, lines: int) -> list[str]:
    if lines == 0:
        return []
    with open(path, encoding="utf-8", errors="replace") as f:
        return [line.rstrip("\n") for line in deque(f, maxlen=lines)]


def _wait(proc: subprocess.Popen, timeout: float | None, cancel: threading.Event | None) -> str:
    """Wait for ``proc``; '' when it ended by itself, else why it was stopped (its process group
    gets SIGTERM, then SIGKILL after STOP_GRACE_S)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    why = ""
    while proc.poll() is None:
        if cancel is not None and cancel.is_set():
            why = "cancelled"
        elif deadline is not None and time.monotonic() > deadline:
            why = f"stopped after timeoutSeconds ({timeout:g} s)"
        if why:
            for sig, grace in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 30.0)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
            return why
        time.sleep(0.1)
    return why


def run_process(plane, dp: DataProcess, cancel: threading.Event | None = None) -> tuple[bool, str]:
    """Run ``dp`` now on ``plane`` (an ``Embedded``); returns ``(ok, reason)``. Status goes
    Executing → Complete (exit code 0) or Failed with the exit code, ``logTail`` (the last
    ``logLines`` lines) and the reason; ``duration`` in seconds. Errors (no runtime for the
    dataset, a mount path in use, a command not found) are in the status and the result."""
    meta, spec = dp.metadata, dp.spec
    name, namespace = spec.dataset.name, spec.dataset.namespace or meta.namespace
    started, t0 = now_iso(), time.monotonic()
    log_file = log_path(plane.home, meta.namespace, meta.name)

    def write(status: dict) -> None:
        plane.state.set_status("DataProcess", meta.name, meta.namespace, {"logFile": log_file, **status})

    write(flowstatus.executing(started))
    try:
        plane.bound(name, namespace)
        mounted = _datacache("mount", name, spec.mount_path, "-n", namespace, "--home", plane.home, "--background",
                             "--timeout", str(MOUNT_TIMEOUT_S), timeout=MOUNT_TIMEOUT_S + 10)
        if mounted.returncode != 0:
            lines = [l for l in mounted.stderr.splitlines() if l.strip()]
            raise DatacacheError(f"cannot mount dataset {namespace}/{name} at {spec.mount_path}: "
                                 f"{lines[-1] if lines else 'exit code ' + str(mounted.returncode)}")
    except (DatacacheError, OSError, subprocess.TimeoutExpired) as err:
        reason = describe_error(err) if not isinstance(err, subprocess.TimeoutExpired) else "the mount timed out"
        write(flowstatus.finished("Failed", started, t0, "MountFailed", reason))
        return False, reason
    try:
        private.makedirs(os.path.dirname(log_file))
        # The command reads through the mount: it gets no UFS credentials (embedded secrets live in env vars).
        inherited = {k: v for k, v in os.environ.items() if not k.startswith(SECRET_ENV_PREFIX)}
        env = {**inherited, **{v.name: v.value for v in spec.env}, "DATACACHE_DATASET_PATH": spec.mount_path}
        fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            proc = subprocess.Popen([*spec.command, *spec.args], stdin=subprocess.DEVNULL, stdout=fd,
                                    stderr=subprocess.STDOUT, env=env, start_new_session=True)
        except OSError as err:
            reason = f"cannot start {spec.command[0]!r}: {err.strerror or err}"
            write(flowstatus.finished("Failed", started, t0, "StartFailed", reason))
            return False, reason
        finally:
            os.close(fd)
        stopped = _wait(proc, spec.timeout_seconds, cancel)
    finally:
        _datacache("unmount", spec.mount_path, "--home", plane.home, timeout=60)
    tail = _tail(log_file, spec.log_lines)
    code = proc.returncode
    fields = {"exitCode": code, "logTail": tail}
    if code == 0 and not stopped:
        write(flowstatus.finished("Complete", started, t0, "Complete", "exit code 0", **fields))
        return True, "exit code 0"
    last = next((line for line in reversed(tail) if line.strip()), "")
    reason = f"{stopped or 'the command failed'}: exit code {code}" + (f"; its log ends with: {last}" if last else "")
    phase = "Cancelled" if stopped == "cancelled" else "Failed"
    write(flowstatus.finished(phase, started, t0, "ProcessFailed", reason, **fields))
    return False, reason
