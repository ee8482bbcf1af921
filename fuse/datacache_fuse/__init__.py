"""datacache's FUSE mount: a dataset as a read-only POSIX directory tree.

``datacache mount DATASET MOUNTPOINT`` serves one dataset through datacache's own FUSE transport so that
training code reads it with ``open()``, ``os.scandir``, ``mmap``, Pillow, pyarrow or a PyTorch
DataLoader unchanged. The package is split by job:

- :mod:`.inodes`   — path <-> inode numbers for the manifest's directory tree;
- :mod:`.kernel_ops` — the handlers: translate requests into DatasetClient calls, nothing more
  (they know nothing of workers, UFS or caching policy);
- :mod:`.handles`, :mod:`.changes`, :mod:`.shown` — an open file, the directory entries a
  manifest change contradicts, what a mount shows besides file bytes;
- :mod:`datacache.mountinfo` (core, shared with the control plane) — what the kernel says about
  a mount point: live, dead (ENOTCONN) or none, lazy unmount, the bdi read-ahead window;
- :mod:`.daemon`   — one FUSE daemon process: open the dataset, mount, serve, clean up;
- :mod:`.launcher` — ``--background`` (detached daemon, wait for the mount) and ``--restart``
  (a supervisor that re-mounts when the daemon dies);
- :mod:`.cli`      — the click commands ``mount`` and ``unmount`` added to ``datacache``;
- :mod:`.kernel`   — the FUSE transport: the kernel protocol on ``/dev/fuse`` (no libfuse, no
  compiled build step), kernel passthrough.
"""

from datacache_fuse import cli  # noqa: E402  (cheap: the transport is imported only when a daemon starts)

__all__ = ["cli"]
