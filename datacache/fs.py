"""``datacache://DATASET/path``: the cache as an fsspec filesystem, for pandas, pyarrow and torch.

Registered under the ``fsspec.specs`` entry point, so ``fsspec.open("datacache://imagenet/train/
x.JPEG")`` and ``pd.read_parquet("datacache://ds/t.parquet")`` read through the cache with no
mount. Paths are ``DATASET/path/in/dataset``; the top level lists datasets. Read-only: opening for
writing raises ``PermissionError`` (EROFS). Storage option ``home`` selects ``$DATACACHE_HOME``.
Pickles by its arguments (fsspec does this), so DataLoader worker processes open their own clients.
Storage option ``record``: a run name (True: one from the time) under which the files read, in the
order of their first read, are written to the dataset's trace (:mod:`datacache.plan.trace`), for
``datacache warmup DATASET --from-trace RUN``.
A file version complete in the node's file tier opens as a plain local file object over its
contiguous cache file (the same version check: the file is named by the manifest's version), so
it reads at the local disk's speed, and pyarrow reads it without copies
(:class:`~datacache.cached_file.CachedFile`); others open as a ``DatasetFile`` reading blocks.
"""

from __future__ import annotations

import errno
import operator
import threading

from fsspec import AbstractFileSystem

from datacache.cached_file import CachedFile
from datacache.errors import ResourceError


class DatacacheFileSystem(AbstractFileSystem):
    """fsspec filesystem over embedded datasets (``namespace`` option: default "default")."""

    protocol = "datacache"
    root_marker = ""

    def __init__(self, home: str | None = None, namespace: str = "default", record: str | bool | None = None,
                 **kwargs):
        if record is True or record == "":
            from datacache.plan.trace import run_name

            record = run_name(None)  # named once here: DataLoader workers unpickle the same name
        if record:
            kwargs["record"] = record
        super().__init__(home=home, namespace=namespace, **kwargs)
        self.record = record or None
        self._home = home
        self._namespace = namespace
        self._paths = None
        self._clients: dict = {}
        self._lock = threading.Lock()

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = str(path)
        if path.startswith("datacache://"):
            path = path[len("datacache://"):]
        return path.strip("/")

    def _client(self, dataset: str):
        client = self._clients.get(dataset)  # every read asks: no lock once the client exists
        if client is not None:
            return client
        with self._lock:
            client = self._clients.get(dataset)
            if client is None:
                try:
                    client = self._read_path().open_dataset(dataset, self._namespace)
                except ResourceError as err:
                    raise FileNotFoundError(errno.ENOENT, str(err), dataset) from None
                if self.record:
                    from datacache.stack.plans import recorder

                    client.on_read(recorder(self._read_path().home, dataset, self._namespace, self.record))
                self._clients[dataset] = client
            return client

    def _read_path(self):
        if self._paths is None:
            from datacache.control.embedded import read_path

            self._paths = read_path(self._home)
        return self._paths

    def _split(self, path: str) -> tuple[str, str]:
        path = self._strip_protocol(path)
        dataset, _, rest = path.partition("/")
        return dataset, rest

    def ls(self, path, detail=True, **kwargs):
        dataset, rest = self._split(path)
        if not dataset:
            names = [d["metadata"]["name"] for d in self._read_path().state.list("Dataset", self._namespace)]
            out = [{"name": n, "type": "directory", "size": 0} for n in names]
        else:
            client = self._client(dataset)
            try:
                children = client.listdir(rest)
            except ValueError as err:
                raise FileNotFoundError(errno.ENOENT, str(err), path) from None
            except NotADirectoryError:
                return [self.info(path)] if detail else [self._strip_protocol(path)]
            base = f"{dataset}/{rest}".rstrip("/")
            out = [self._entry_info(f"{base}/{name}", e) for name, e in sorted(children.items())]
        return out if detail else [o["name"] for o in out]

    @staticmethod
    def _entry_info(name: str, entry) -> dict:
        if entry is None:
            return {"name": name, "type": "directory", "size": 0}
        return {"name": name, "type": "file", "size": entry.size, "mtime": entry.mtime, "version": entry.version}

    def info(self, path, **kwargs):
        dataset, rest = self._split(path)
        if not dataset:
            return {"name": "", "type": "directory", "size": 0}
        try:
            entry = self._client(dataset).stat(rest)
        except ValueError as err:
            raise FileNotFoundError(errno.ENOENT, str(err), path) from None
        return self._entry_info(self._strip_protocol(path), entry)

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        if "r" not in mode or any(c in mode for c in "wax+"):
            raise PermissionError(errno.EROFS, "datacache datasets are read-only", path)
        dataset, rest = self._split(path)
        client = self._client(dataset)
        try:
            entry = client.stat(rest)
        except ValueError as err:
            raise FileNotFoundError(errno.ENOENT, str(err), path) from None
        if entry is None:
            raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        fd = client.local_file(entry)  # the version complete in the cache: a plain local file
        if fd is None:
            return client.open_entry(entry)
        client.reading(entry)
        return CachedFile(fd, entry.path, entry.size)

    def cat_file(self, path, start=None, end=None, **kwargs):
        # No file object: a small file is one block read (DatasetClient.read).
        dataset, rest = self._split(path)
        client = self._client(dataset)
        entry = client.stat(rest)
        if entry is None:
            raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        size = entry.size
        start = 0 if start is None else operator.index(start)  # TypeError for a float, as io.FileIO
        end = size if end is None else operator.index(end)
        start = start if start >= 0 else max(size + start, 0)
        end = end if end >= 0 else max(size + end, 0)
        return client.read(entry, start, max(end - start, 0))

    def close(self) -> None:
        """Close every dataset client this instance opened."""
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()
            if self._paths is not None:
                self._paths.close()
                self._paths = None
