"""The read-path stack: one place that assembles a dataset's read path from its resources.

A Dataset and its runtime (stored resources) become, in order: the namespace (the stored
manifest), the UFS (its mounts opened by the runtime's engine), the tiered store (the runtime's
levels under one directory layout), the block source (in-process, or the runtime's cache
workers) and the :class:`~datacache.dataset_client.DatasetClient` readers use. The embedded control
plane, ``datacache://``, the FUSE daemon and the cache worker process all call
:class:`~datacache.stack.readpath.ReadPath`; none of them builds a control plane to read.

- :mod:`.layout`    — where everything lives under ``$DATACACHE_HOME`` (computed only here);
- :mod:`.engines`   — the runtime bound to a Dataset, as an engine (built-in, or a plugin by
  entry point: the core never imports a plugin package);
- :mod:`.readpath`  — the assembly itself;
- :mod:`.syncmark`, :mod:`.refreshed` — per-dataset marks shared by readers and syncs (a sync
  running, the manifest write lock, paths readers refreshed).
"""
