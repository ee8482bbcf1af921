"""Build and install pyfuse3 with datacache's two patches: the kernel's no-open mode and a reader-callback main loop.

Why, 1: a FUSE file system whose ``open`` answers ENOSYS puts the kernel in *no-open* mode: it stops
sending OPEN and RELEASE and keeps every file's page cache (``FOPEN_KEEP_CACHE`` is the default
there, fs/fuse/file.c ``fuse_file_open``), so a warm epoch over small files never reaches the
daemon. Its reads then carry ``fh == 0``, and pyfuse3's ``read(fh, off, size)`` drops the inode
libfuse passes, so stock pyfuse3 cannot tell those reads apart. The patch passes the inode in
place of a zero ``fh`` (``READ`` only) and marks the module with ``READ_FH_ZERO_IS_INODE = True``;
:mod:`datacache_fuse.ops` uses no-open mode only when it finds that marker, and the classic
open/release handles otherwise (stock pyfuse3 keeps working).

Why, 2: what still reaches the daemon on a warm epoch is one FUSE_IOCTL per buffered ``open()``
(CPython before 3.14 asks ``isatty``), and pyfuse3's ``main()`` spends ~19 us of Python per request
waiting for it. ``fuse/pyfuse3_dispatch.pxi`` adds ``pyfuse3.main_readable()``, which takes queued
requests from one asyncio reader callback (~2 us); :mod:`datacache_fuse.daemon` uses it when present.

Usage: ``python fuse/build_pyfuse3.py [--wheel-dir DIR]``: download pyfuse3's sdist (the version
below) from the package index, patch it, and ``pip install`` it (or build a wheel into DIR, for
the Docker image). Needs a C compiler and libfuse3's headers (Debian: ``libfuse3-dev``,
``pkg-config``). Does nothing when the patched version is already installed. Exits non-zero with
a message when a step fails or the sdist no longer has the lines the patch replaces.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import pathlib
import subprocess
import sys
import tarfile
import tempfile

VERSION = "3.5.0"
MARKER = "READ_FH_ZERO_IS_INODE"
DISPATCH = pathlib.Path(__file__).with_name("pyfuse3_dispatch.pxi")  # copied in as pyfuse3/dispatch.pxi

# (file in the sdist, the text to find, its replacement): each must match exactly once.
EDITS = (
    ("src/pyfuse3/handlers.pxi",
     "    c.off = off\n    c.fh = fi.fh\n    save_retval(fuse_read_async(c))\n",
     "    c.off = off\n"
     "    # datacache: in no-open mode (open answered ENOSYS) every read has fh 0: pass the inode.\n"
     "    c.fh = fi.fh if fi.fh != 0 else ino\n"
     "    save_retval(fuse_read_async(c))\n"),
    ("src/pyfuse3/__init__.pyx",
     "ROOT_INODE = FUSE_ROOT_ID\n",
     f"ROOT_INODE = FUSE_ROOT_ID\n{MARKER} = True  # datacache: read() gets the inode when fh is 0\n"),
    ("src/pyfuse3/__init__.pyx",
     'include "internal.pxi"\n',
     'include "internal.pxi"\ninclude "dispatch.pxi"  # datacache: main_readable()\n'),
    ("src/pyfuse3/__init__.pyx",
     "    fuse_session_exit(session)\n    trio.lowlevel.notify_closing(session_fd)\n",
     "    fuse_session_exit(session)\n    trio.lowlevel.notify_closing(session_fd)\n"
     "    if _dispatch_active is not None:  # datacache: main_readable() returns\n"
     "        _dispatch_active.finish()\n"),
)


def installed() -> bool:
    """True when pyfuse3 ``VERSION`` with the patch is importable in this interpreter."""
    try:
        if importlib.metadata.version("pyfuse3") != VERSION:
            return False
    except importlib.metadata.PackageNotFoundError:
        return False
    probe = (f"import sys, pyfuse3; sys.exit(0 if getattr(pyfuse3, {MARKER!r}, False) "
             f"and hasattr(pyfuse3, 'main_readable') else 1)")
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def patch(tree: pathlib.Path) -> None:
    """Apply :data:`EDITS` and copy :data:`DISPATCH` under ``tree``; SystemExit when an anchor is
    missing or not unique."""
    (tree / "src/pyfuse3/dispatch.pxi").write_text(DISPATCH.read_text(encoding="utf-8"), encoding="utf-8")
    for rel, old, new in EDITS:
        path = tree / rel
        text = path.read_text(encoding="utf-8")
        if text.count(old) != 1:
            raise SystemExit(f"build_pyfuse3: {rel} of pyfuse3 {VERSION} does not have the expected lines; "
                             f"the patch needs updating")
        path.write_text(text.replace(old, new), encoding="utf-8")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel-dir", help="build a wheel into this directory instead of installing")
    args = parser.parse_args(argv)
    if args.wheel_dir is None and installed():
        print(f"build_pyfuse3: pyfuse3 {VERSION} with the patches is installed")
        return 0
    pip = [sys.executable, "-m", "pip"]
    with tempfile.TemporaryDirectory(prefix="pyfuse3-") as tmp:
        subprocess.run(pip + ["download", "--quiet", "--no-deps", "--no-binary", ":all:", "--dest", tmp,
                              f"pyfuse3=={VERSION}"], check=True)
        (sdist,) = pathlib.Path(tmp).glob("pyfuse3-*.tar.gz")
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        tree = pathlib.Path(tmp) / f"pyfuse3-{VERSION}"
        patch(tree)
        if args.wheel_dir:
            subprocess.run(pip + ["wheel", "--quiet", "--no-deps", "--wheel-dir", args.wheel_dir, str(tree)], check=True)
        else:
            subprocess.run(pip + ["install", "--quiet", "--force-reinstall", "--no-deps", str(tree)], check=True)
            subprocess.run(pip + ["install", "--quiet", "pyfuse3==" + VERSION], check=True)  # its dependencies (trio)
    print(f"build_pyfuse3: built pyfuse3 {VERSION} with the patches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
