"""datacache's own FUSE transport: the kernel protocol on ``/dev/fuse``, without libfuse.

Pure Python, no build step; read-only; kernel passthrough for files held in a local file.

- :mod:`.abi`         — opcodes, flags and struct layouts of the kernel protocol (7.45);
- :mod:`.errnos`      — Python exceptions to errno values, in one table;
- :mod:`.operations`  — the interface a file system implements (synchronous methods) and its
  answer types (``Attr``, ``EntryOut``, ``OpenOut``, ``StatFs``, ``DirEntry``);
- :mod:`.passthrough` — backing ids (``FUSE_DEV_IOC_BACKING_*``), one per backing file, and when
  to serve through READ instead;
- :mod:`.mount`       — ``mount(2)`` as root, ``fusermount3`` fd passing otherwise; unmount;
- :mod:`.session`     — INIT negotiation, worker threads on cloned descriptors, the dispatch table,
  notifications;
- :mod:`.server`      — mount + session + unmount as one object (``FuseServer``).
"""
