"""datacache's runtimes: the built-in cache runtime and thin runtimes for self-built filesystems.

A runtime turns a Dataset's mounts into readable filesystems; the cache, warmup, ``datacache://``
and the FUSE mount for readers sit on top, the same for every runtime. A thin runtime plugs a
storage system in two ways (``runtimes/README.md`` walks through both):

- :mod:`.plugins`: a Python entry point in group ``datacache.runtimes`` returning an fsspec
  filesystem for a mount; :mod:`.sftp` is one (SFTP through paramiko);
- :mod:`.fusecmd`: a FUSE command that mounts the storage at a target directory given in a config
  file, which is then read as a local directory; :mod:`.sshfs` is one (Debian's sshfs).

:mod:`.engines` builds a runtime by kind for the control plane; :mod:`.secretfiles` hands secrets
to runtimes as file paths, never values. Ready-made profiles are in ``profiles/*.yaml``.
"""

from datacache_runtimes.engines import engine_for, register_profile_schemes, stop_runtime

__all__ = ["engine_for", "register_profile_schemes", "stop_runtime"]
