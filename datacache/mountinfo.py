"""What the kernel says about a mount point, and the few things we ask it to do.

- :func:`probe` tells a live FUSE mount from a dead one. When a FUSE daemon dies (SIGKILL, OOM),
  its mount stays in the mount table and every access answers ENOTCONN ("Transport endpoint is not
  connected"); ``mkdir``/``mount`` on it then fail with "File exists". Case C11 wants ``datacache
  mount`` to recognise that state, lazily unmount the corpse and mount afresh with no manual
  clean-up, so :func:`probe` looks at both the mount table (``/proc/self/mountinfo``) and a
  ``statvfs`` bounded by a timeout (a daemon that is alive but stuck must not hang the caller).
  ``statvfs``, not ``stat``: the kernel caches attributes for ``attr_timeout`` seconds, so a
  ``stat`` of a dead mount's root can still succeed, while STATFS always reaches the daemon.
- :func:`lazy_unmount` detaches a mount even while files on it are open elsewhere
  (``fusermount3 -u -z``, falling back to ``umount -l``): the path is free at once, open files keep
  working until closed, and then the daemon's session ends.
- :func:`set_read_ahead` widens the mount's bdi read-ahead window. The kernel sizes FUSE read
  requests by the read-ahead window (128 KiB by default), so the daemon writes
  ``/sys/class/bdi/<major:minor>/read_ahead_kb`` after the kernel's INIT request has been
  answered (the INIT reply resets it).

Paths are compared as the kernel prints them: absolute, parent symlinks resolved, without touching
the mount point itself (which may be dead).
"""

from __future__ import annotations

import enum
import errno
import logging
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass

log = logging.getLogger("datacache_fuse")

MOUNTINFO = "/proc/self/mountinfo"
DEAD_ERRNOS = (errno.ENOTCONN, errno.ECONNABORTED)
PROBE_TRIES = 5  # statvfs taken again while the mount at the path keeps changing under it


class MountState(enum.Enum):
    """``NONE``: no FUSE mount at the path; ``LIVE``: a FUSE mount that answers; ``DEAD``: a FUSE
    mount whose daemon is gone (ENOTCONN); ``HUNG``: a FUSE mount that did not answer in time."""

    NONE = "none"
    LIVE = "live"
    DEAD = "dead"
    HUNG = "hung"


class UnmountError(OSError):
    """Neither ``fusermount3 -u -z`` nor ``umount -l`` could detach the mount."""


@dataclass(frozen=True)
class MountEntry:
    """One line of ``/proc/self/mountinfo``: ``dev`` is ``"major:minor"`` (the bdi name),
    ``mount_id`` the mount's unique id (what ``/proc/PID/fdinfo/FD`` calls ``mnt_id``)."""

    mountpoint: str
    dev: str
    fstype: str
    source: str
    options: str
    mount_id: int = 0

    @property
    def is_fuse(self) -> bool:
        return self.fstype == "fuse" or self.fstype.startswith(("fuse.", "fuseblk"))


def canonical(path: str) -> str:
    """``path`` as the mount table prints it: absolute, with symlinks in its *parents* resolved.
    The last component is not touched (stat of a dead mount point would fail)."""
    path = os.path.abspath(path)
    parent, name = os.path.split(path)
    return os.path.join(os.path.realpath(parent), name) if name else parent


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \040, \011, \012, \134
    if "\\" not in field:
        return field
    raw = field.encode("utf-8", "surrogateescape")
    out, i = bytearray(), 0
    while i < len(raw):
        if raw[i] == 0x5C and i + 4 <= len(raw) and raw[i + 1:i + 4].isdigit():
            out.append(int(raw[i + 1:i + 4], 8))
            i += 4
        else:
            out.append(raw[i])
            i += 1
    return out.decode("utf-8", "surrogateescape")


def mounts(mountinfo: str = MOUNTINFO) -> list[MountEntry]:
    """Every mount of this process's mount namespace, in mount order (later ones on top)."""
    entries = []
    with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            left, _, right = line.rstrip("\n").partition(" - ")
            lf, rf = left.split(" "), right.split(" ")
            if len(lf) < 6 or len(rf) < 3:
                continue
            entries.append(MountEntry(_unescape(lf[4]), lf[2], rf[0], _unescape(rf[1]), rf[2], int(lf[0])))
    return entries


def mounted_at(path: str) -> MountEntry | None:
    """The top-most mount at ``path`` (canonicalised), or None."""
    target = canonical(path)
    found = None
    for entry in mounts():
        if entry.mountpoint == target:
            found = entry
    return found


def _statvfs(path: str, timeout: float):
    """``None`` when ``os.statvfs(path)`` succeeds, the OSError it raised, or ``TimeoutError``."""
    result: list = []

    def run():
        try:
            os.statvfs(path)
            result.append(None)
        except OSError as err:
            result.append(err)

    t = threading.Thread(target=run, name="datacache-fuse-probe", daemon=True)
    t.start()
    t.join(timeout)
    return result[0] if result else TimeoutError(f"statvfs({path!r}) did not answer within {timeout} s")


def probe(path: str, timeout: float = 5.0) -> MountState:
    """The state of the FUSE mount at ``path`` (see :class:`MountState`); ``timeout`` in seconds
    bounds the ``statvfs``. A path that is not a FUSE mount (a plain directory, a tmpfs, a missing
    path) is ``NONE``.

    The mount table is read before and after the ``statvfs``; when its top entry changed meanwhile
    (a dead mount detached, another mounted), the answer came from another file system and the
    probe is taken again: taken across a lazy unmount, a plain directory's answer passed for LIVE.
    """
    top = mounted_at(path)
    for _ in range(PROBE_TRIES):
        res = _statvfs(path, timeout)
        after = mounted_at(path)
        if after == top:
            break
        top = after
    if isinstance(res, TimeoutError):
        return MountState.HUNG
    if isinstance(res, OSError) and res.errno in DEAD_ERRNOS:
        return MountState.DEAD
    if top is None or not top.is_fuse:
        return MountState.NONE
    return MountState.LIVE if res is None else MountState.DEAD


def lazy_unmount(path: str) -> None:
    """Detach the mount at ``path`` now, even if files on it are open (``fusermount3 -u -z``, then
    ``umount -l``). Raises :class:`UnmountError` with both tools' messages when it stays mounted."""
    target = canonical(path)
    problems = []
    for cmd in (["fusermount3", "-u", "-z", target], ["umount", "-l", target]):
        if shutil.which(cmd[0]) is None:
            problems.append(f"{cmd[0]}: not installed")
            continue
        try:
            r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired:
            problems.append(f"{cmd[0]}: timed out")
            continue
        if r.returncode == 0:
            log.info("unmounted %s (%s)", target, " ".join(cmd[:-1]))
            return
        problems.append(f"{' '.join(cmd[:-1])}: {(r.stderr or r.stdout).strip() or 'exit ' + str(r.returncode)}")
    top = mounted_at(target)
    if top is None or not top.is_fuse:
        return  # someone else unmounted it meanwhile
    raise UnmountError(errno.EBUSY, "could not unmount: " + "; ".join(problems), target)


def users(entry: MountEntry) -> list[int]:
    """Pids (other than ours) holding a file of the mount ``entry`` open or mapped, or working
    inside it: what keeps a lazily detached mount, and its daemon, alive. Read from ``/proc``
    (``fdinfo``'s ``mnt_id``, ``maps``' device, ``cwd``) without touching the mount itself; a
    process that ends or hides its ``/proc`` meanwhile is skipped."""
    major, minor = (int(x) for x in entry.dev.split(":"))
    dev = f"{major:02x}:{minor:02x}"
    inside = entry.mountpoint.rstrip("/") + "/"
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            if _uses(f"/proc/{name}", entry.mount_id, dev, inside):
                found.append(int(name))
        except OSError:
            continue
    return sorted(found)


def _uses(proc: str, mount_id: int, dev: str, inside: str) -> bool:
    if (os.readlink(f"{proc}/cwd") + "/").startswith(inside):
        return True
    for fd in os.listdir(f"{proc}/fdinfo"):
        try:
            with open(f"{proc}/fdinfo/{fd}", encoding="ascii", errors="replace") as f:
                if any(line.split() == ["mnt_id:", str(mount_id)] for line in f):
                    return True
        except OSError:  # the fd closed meanwhile
            continue
    with open(f"{proc}/maps", encoding="ascii", errors="replace") as f:
        return any(line.split()[3:4] == [dev] for line in f)


def set_read_ahead(path: str, kib: int = 1024) -> int | None:
    """Set the read-ahead window of the mount at ``path`` to ``kib`` KiB (so the kernel sends
    ``kib``-sized read requests); returns the value now in effect, or None when it cannot be set
    (not mounted, no /sys/class/bdi, not permitted). Never raises."""
    top = mounted_at(path)
    if top is None:
        return None
    knob = f"/sys/class/bdi/{top.dev}/read_ahead_kb"
    try:
        with open(knob, "w") as f:
            f.write(str(int(kib)))
        with open(knob) as f:
            return int(f.read().strip())
    except (OSError, ValueError) as err:
        log.warning("could not set %s to %d: %s (reads stay at the kernel's default size)", knob, kib, err)
        return None
