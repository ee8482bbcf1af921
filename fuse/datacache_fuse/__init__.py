"""datacache's FUSE mount: a dataset as a read-only POSIX directory tree.

``datacache mount DATASET MOUNTPOINT`` serves one dataset through pyfuse3 (on asyncio) so that
training code reads it with ``open()``, ``os.scandir``, ``mmap``, Pillow, pyarrow or a PyTorch
DataLoader unchanged. The package is split by job:

- :mod:`.inodes`   — path <-> inode numbers for the manifest's directory tree;
- :mod:`.errmap`   — the one place where Python exceptions become errno values;
- :mod:`.ops`      — the ``pyfuse3.Operations`` subclass: translates requests into DatasetClient
  calls, nothing more (it knows nothing of workers, UFS or caching policy);
- :mod:`datacache.mountinfo` (core, shared with the control plane) — what the kernel says about
  a mount point: live, dead (ENOTCONN) or none, lazy unmount, the bdi read-ahead window;
- :mod:`.daemon`   — one FUSE daemon process: open the dataset, mount, serve, clean up;
- :mod:`.launcher` — ``--background`` (detached daemon, wait for the mount) and ``--restart``
  (a supervisor that re-mounts when the daemon dies);
- :mod:`.cli`      — the click commands ``mount`` and ``unmount`` added to ``datacache``;
- :mod:`.kernel`   — datacache's own FUSE transport (the kernel protocol on ``/dev/fuse``, no
  libfuse or pyfuse3, kernel passthrough); not yet used by the daemon.
"""

from datacache_fuse import cli  # noqa: E402  (cheap: pyfuse3 is imported only when a daemon starts)

__all__ = ["cli"]
