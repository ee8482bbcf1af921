"""Build and install pyfuse3 with datacache's one-line read patch (the kernel's no-open mode).

Why: a FUSE file system whose ``open`` answers ENOSYS puts the kernel in *no-open* mode: it stops
sending OPEN and RELEASE and keeps every file's page cache (``FOPEN_KEEP_CACHE`` is the default
there, fs/fuse/file.c ``fuse_file_open``), so a warm epoch over small files never reaches the
daemon. Its reads then carry ``fh == 0``, and pyfuse3's ``read(fh, off, size)`` drops the inode
libfuse passes, so stock pyfuse3 cannot tell those reads apart. The patch passes the inode in
place of a zero ``fh`` (``READ`` only) and marks the module with ``READ_FH_ZERO_IS_INODE = True``;
:mod:`datacache_fuse.ops` uses no-open mode only when it finds that marker, and the classic
open/release handles otherwise (stock pyfuse3 keeps working).

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
)


def installed() -> bool:
    """True when pyfuse3 ``VERSION`` with the patch is importable in this interpreter."""
    try:
        if importlib.metadata.version("pyfuse3") != VERSION:
            return False
    except importlib.metadata.PackageNotFoundError:
        return False
    probe = f"import sys, pyfuse3; sys.exit(0 if getattr(pyfuse3, {MARKER!r}, False) else 1)"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def patch(tree: pathlib.Path) -> None:
    """Apply :data:`EDITS` under ``tree``; SystemExit when an anchor is missing or not unique."""
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
        print(f"build_pyfuse3: pyfuse3 {VERSION} with the read patch is installed")
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
    print(f"build_pyfuse3: built pyfuse3 {VERSION} with the read patch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
