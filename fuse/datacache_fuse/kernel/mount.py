"""Mount and unmount a FUSE file system without libfuse.

- As root: ``open("/dev/fuse")`` and ``mount(2)`` with ``fd=N,rootmode=40000,user_id=U,group_id=G``
  (what libfuse's ``fuse_mount_sys`` does). The file system type is ``fuse.<subtype>`` and the
  source ``fsname``, so ``/proc/self/mountinfo`` shows ``fuse.datacache`` / ``datacache:NS/NAME``
  as :mod:`datacache.mountinfo` expects.
- Otherwise (or when ``mount(2)`` answers EPERM): ``fusermount3``, the setuid helper, mounts and
  hands the ``/dev/fuse`` descriptor back over a socket named by the ``_FUSE_COMMFD`` environment
  variable, as ``SCM_RIGHTS`` ancillary data (libfuse's ``mount.c``, ``fuse_mount_fusermount``).
- Unmount: ``umount2(MNT_DETACH)`` as root (``MNT_FORCE`` also aborts the connection, so blocked
  requests fail at once), ``fusermount3 -u -z`` otherwise (see :func:`.mountinfo.lazy_unmount`).

The mount is read-only (``MS_RDONLY``), ``nosuid`` and ``nodev``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import shutil
import socket
import subprocess
from dataclasses import dataclass

from datacache import mountinfo

log = logging.getLogger("datacache_fuse")

MS_RDONLY, MS_NOSUID, MS_NODEV = 1, 2, 4
MNT_FORCE, MNT_DETACH = 1, 2

#: Generic mount options that are mount(2) flags, not FUSE data (libfuse's mount.c does the same);
#: None: accepted and ignored (the mount is always read-only, nosuid, nodev).
FLAG_OPTIONS: dict[str, int | None] = {
    "noexec": 8, "sync": 16, "dirsync": 128, "noatime": 1024, "nodiratime": 2048, "relatime": 1 << 21,
    "strictatime": 1 << 24, "lazytime": 1 << 25,
    "ro": None, "rw": None, "nosuid": None, "nodev": None, "suid": None, "dev": None, "exec": None,
    "async": None, "atime": None, "diratime": None, "norelatime": None, "nostrictatime": None,
    "nolazytime": None,
}

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
_libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)


class FuseMountError(OSError):
    """The kernel or ``fusermount3`` refused the mount (``errno`` and a message saying why)."""


@dataclass(frozen=True)
class Mounted:
    """A FUSE mount made by :func:`mount`: ``fd`` is the session's ``/dev/fuse`` descriptor (the
    caller owns it), ``how`` is ``"mount(2)"`` or ``"fusermount3"``."""

    mountpoint: str
    fd: int
    how: str

    def unmount(self, force: bool = False) -> bool:
        """:func:`unmount` of this mount."""
        return unmount(self.mountpoint, force=force, helper=self.how == "fusermount3")


def mount(mountpoint: str, fsname: str, subtype: str = "datacache", *, allow_other: bool = True,
          options: tuple[str, ...] = (), method: str = "auto") -> Mounted:
    """Mount a read-only FUSE file system at ``mountpoint`` (an existing directory).

    ``fsname``: the source shown in the mount table (``datacache:NS/NAME``); ``subtype``: the type
    is ``fuse.<subtype>``; ``allow_other``: users other than the mounting one may enter it;
    ``options``: more mount options: generic ones (``noatime``, ``noexec``...) become mount(2)
    flags (:data:`FLAG_OPTIONS`), others go to the FUSE kernel module as they are (e.g.
    ``max_read=N``); ``default_permissions`` is always set. ``method``:
    ``"syscall"`` (root only), ``"fusermount"``, or ``"auto"`` (the syscall as root, falling back
    to ``fusermount3`` on EPERM). Raises :class:`FuseMountError`; the returned descriptor must be
    served (the kernel has queued INIT on it) and closed by the caller.
    """
    target = mountinfo.canonical(mountpoint)
    if method not in ("auto", "syscall", "fusermount"):
        raise ValueError(f"mount method {method!r}: use auto, syscall or fusermount")
    if method == "syscall" or (method == "auto" and os.geteuid() == 0):
        try:
            return Mounted(target, _mount_syscall(target, fsname, subtype, allow_other, options), "mount(2)")
        except FuseMountError as err:
            if method == "syscall" or err.errno != errno.EPERM:
                raise
            log.info("mount(2) of %s: %s; trying fusermount3", target, err.strerror)
    return Mounted(target, _mount_fusermount(target, fsname, subtype, allow_other, options), "fusermount3")


def _mount_syscall(target: str, fsname: str, subtype: str, allow_other: bool, options) -> int:
    try:
        fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    except OSError as err:
        raise FuseMountError(err.errno, f"cannot open /dev/fuse: {err.strerror} (is the fuse module loaded?)",
                             target) from None
    flags = MS_RDONLY | MS_NOSUID | MS_NODEV
    data = [o for o in options if o not in FLAG_OPTIONS]
    for o in options:
        flags |= FLAG_OPTIONS.get(o) or 0
    opts = [f"fd={fd}", "rootmode=40000", f"user_id={os.getuid()}", f"group_id={os.getgid()}",
            "default_permissions", *(["allow_other"] if allow_other else []), *data]
    rc = _libc.mount(fsname.encode(), os.fsencode(target), f"fuse.{subtype}".encode(), flags,
                     ",".join(opts).encode())
    if rc != 0:
        code = ctypes.get_errno()
        os.close(fd)
        hint = f" (refused option among: {', '.join(data)})" if data and code == errno.EINVAL else ""
        raise FuseMountError(code, f"mount(2) of a FUSE file system failed: {os.strerror(code)}{hint}", target)
    return fd


def _mount_fusermount(target: str, fsname: str, subtype: str, allow_other: bool, options) -> int:
    helper = shutil.which("fusermount3")
    if helper is None:
        raise FuseMountError(errno.ENOENT, "fusermount3 is not installed (install the fuse3 package) "
                                           "and mount(2) needs root", target)
    opts = ["ro", "nosuid", "nodev", "default_permissions", f"fsname={fsname}", f"subtype={subtype}",
            *(["allow_other"] if allow_other else []), *options]
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        env = dict(os.environ, _FUSE_COMMFD=str(theirs.fileno()))
        proc = subprocess.Popen([helper, "-o", ",".join(opts), "--", target], env=env, pass_fds=(theirs.fileno(),),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        theirs.close()
        try:
            _, fds, _, _ = socket.recv_fds(ours, 1, 1)  # empty when fusermount3 failed
        finally:
            _, err = proc.communicate(timeout=30)
    finally:
        ours.close()
        theirs.close()
    if proc.returncode != 0 or not fds:
        for fd in fds:
            os.close(fd)
        why = err.decode(errors="replace").strip() or f"exit {proc.returncode}"
        raise FuseMountError(errno.EPERM if proc.returncode else errno.EIO, f"fusermount3 failed: {why}", target)
    os.set_inheritable(fds[0], False)
    return fds[0]


def unmount(mountpoint: str, force: bool = False, helper: bool | None = None) -> bool:
    """Detach the FUSE mount at ``mountpoint`` now; files open on it keep working until closed,
    then the session ends (reads of its descriptor fail with ENODEV). ``force`` (root only) also
    aborts the connection: pending and later requests fail at once. ``helper``: use
    ``fusermount3 -u -z`` (None: when not root). Returns False when nothing was mounted there;
    raises ``OSError`` when the kernel refuses."""
    target = mountinfo.canonical(mountpoint)
    if helper is None:
        helper = os.geteuid() != 0
    if helper:
        top = mountinfo.mounted_at(target)
        if top is None or not top.is_fuse:
            return False
        mountinfo.lazy_unmount(target)
        return True
    flags = MNT_DETACH | (MNT_FORCE if force else 0)
    if _libc.umount2(os.fsencode(target), flags) != 0:
        code = ctypes.get_errno()
        if code == errno.EINVAL:  # not a mount point (already unmounted)
            return False
        raise OSError(code, f"umount2 failed: {os.strerror(code)}", target)
    return True
