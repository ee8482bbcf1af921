"""datacache's runtimes: the built-in cache runtime and thin runtimes for self-built filesystems.

A runtime turns a Dataset's mounts into readable filesystems; the cache, warmup, ``datacache://``
and the FUSE mount for readers sit on top, the same for every runtime. A thin runtime plugs a
storage system in two ways (``runtimes/README.md`` walks through both):

- :mod:`datacache.ufs.plugins` (the plugin API lives in the core, which loads plugins by entry point): a Python entry point in group ``datacache.runtimes`` returning an fsspec
  filesystem for a mount; :mod:`.sftp` is one (SFTP through paramiko);
- :mod:`.fusecmd`: a FUSE command that mounts the storage at a target directory given in a config
  file, which is then read as a local directory; :mod:`.sshfs` is one (Debian's sshfs).

:mod:`.thin_engine` is the ThinRuntime engine the core finds by entry point (group ``datacache.engines``); :mod:`datacache.ufs.secretfiles` hands secrets
to runtimes as file paths, never values. Ready-made profiles are in ``profiles/*.yaml``.
"""
