"""The dataset namespace over its mounts.

Each mount's ``mountPoint`` (``s3://bucket/prefix``, ``/data``, ``https://host/dir``, ...) is opened
with fsspec (``url_to_fs``) and its options; its files appear under the mount's ``path`` in the
dataset namespace, as Fluid lays out a Dataset's mounts. Dataset paths here are relative and
'/'-separated, with no leading slash: ``s3/imagenet/train/n01/x.JPEG``.

A scheme fsspec does not know but a runtime plugin serves (an entry point in ``datacache.runtimes``
of that name) is opened by the plugin; a ThinRuntime passes its own ``opener`` for every mount.
"""

from __future__ import annotations

import logging
import posixpath
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import fsspec
from fsspec.core import url_to_fs
from fsspec.registry import known_implementations, registry

from datacache.entry import FileEntry, SkippedLink
from datacache.errors import ResourceError
from datacache.manifest import DIR, normalize
from datacache.ufs.credentials import redact, resolve_options
from datacache.ufs.listing import stream_infos
from datacache.ufs.plugins import open_plugin_mount
from datacache.ufs.retry import RETRY_OPTIONS, policy_from_options
from datacache.ufs.schemes import plugin_schemes
from datacache.ufs.versions import mtime_of, read_exact, version_of

# Every UFS call is bounded: a stalled store must become an error, never a hang. The mount
# options connect_timeout/read_timeout (seconds) bound one try; botocore tries once, because
# reads are tried again by datacache.ufs.retry (3 tries: a stalled read fails within 3 * 15 s + 4 s).
_S3_TIMEOUTS = {"connect_timeout": 5.0, "read_timeout": 10.0}

log = logging.getLogger("datacache.ufs")


@dataclass
class UfsMount:
    """One opened mount: ``name``, ``prefix`` (dataset path where it appears, '' for the root),
    ``root`` (path inside ``fs``) and the fsspec filesystem ``fs``."""

    name: str
    prefix: str
    root: str
    fs: fsspec.AbstractFileSystem

    def dataset_path(self, ufs_path: str) -> str:
        rel = ufs_path[len(self.root):].lstrip("/") if self.root else ufs_path.lstrip("/")
        return posixpath.join(self.prefix, rel) if self.prefix else rel


MountOpener = Callable[[Any, str], "tuple[fsspec.AbstractFileSystem, str]"]
"""``opener(mount, where) -> (fs, root)``: a runtime's way to open one mount (``where`` locates it
in error messages); ``root`` is the mount's directory inside ``fs``."""


class UnionNamespace:
    """All mounts of one Dataset.

    ``dataset``: a ``datacache.api`` Dataset; ``home``: DATACACHE_HOME for secret files;
    ``opener``: see :data:`MountOpener` (None: each mount's URL through fsspec or its scheme's plugin).
    Without an ``opener`` the mounts are opened on first use (:attr:`mounts`), so a reader whose
    blocks are all cached needs no UFS credentials and imports no UFS client; a runtime's opener
    runs at once (it may start the runtime's FUSE command). Opening raises ``ResourceError`` for an
    unresolvable secret, a protocol whose package is missing (fsspec's message names the package to
    install) or options the filesystem refuses.
    """

    def __init__(self, dataset, home: str, opener: MountOpener | None = None):
        self.name = dataset.metadata.name
        self.secrets: list[str] = []
        self.policies = {m.name: policy_from_options(m.options) for m in dataset.spec.mounts}  # retries
        self.mount_points = {m.name: m.mount_point for m in dataset.spec.mounts}  # as written, for messages
        self._specs = list(dataset.spec.mounts)
        self._open_mount = opener or (lambda m, where: self._open_url(m, where, home))
        self._mounts: dict[str, UfsMount] | None = None
        self._lock = threading.Lock()
        if opener is not None:
            self._opened()  # a runtime's opener runs now

    @property
    def mounts(self) -> dict[str, UfsMount]:
        """Mount name -> :class:`UfsMount`, opened on the first use (see the class docstring)."""
        return self._opened()

    def _opened(self) -> dict[str, UfsMount]:
        if self._mounts is None:
            with self._lock:
                if self._mounts is None:
                    mounts = {}
                    for i, m in enumerate(self._specs):
                        fs, root = self._open_mount(m, f"dataset {self.name!r}: spec.mounts[{i}]")
                        mounts[m.name] = UfsMount(m.name, m.path.strip("/"), root.rstrip("/"), fs)
                    self._mounts = mounts
        return self._mounts

    def _open_url(self, m, where: str, home: str) -> tuple[fsspec.AbstractFileSystem, str]:
        if m.scheme not in known_implementations and m.scheme not in registry and m.scheme in plugin_schemes():
            return open_plugin_mount(m.scheme, m, home, where)
        options, secrets = resolve_options(m, home, where)
        self.secrets += secrets
        for key in RETRY_OPTIONS:  # datacache's own (self.policies), not the filesystem's
            options.pop(key, None)
        url = m.mount_point if "://" in m.mount_point else f"file://{m.mount_point}"
        try:
            if url.startswith(("s3://", "s3a://")):
                bounds = {k: float(options.pop(k, v)) for k, v in _S3_TIMEOUTS.items()}
                options["config_kwargs"] = {**bounds, "retries": {"total_max_attempts": 1}}
            return url_to_fs(url, **options)
        except (ImportError, ValueError, TypeError) as err:  # missing package, bad option value
            raise ResourceError(redact(f"{where}: cannot open mountPoint {m.mount_point!r}: {err} (check the "
                                       "mountPoint and its options)", self.secrets)) from None

    def list_files(self) -> Iterator[FileEntry | SkippedLink]:
        """Every file of every mount, with its version, streamed (see :mod:`datacache.ufs.listing`):
        memory holds one listing page (S3) or a few directories (other filesystems), never the
        whole listing. Order: S3 mounts in key order, others directory by directory
        (``control.sync`` sorts).

        Directories come too, as entries whose path ends in '/' (size 0, version ''; see
        :mod:`datacache.manifest`): each directory of a walked source, each directory marker of an
        object store (a key ``valid/``), and the mount's own ``path`` (so an empty mount shows).
        Symbolic links of a POSIX source are not followed (valid, dangling, looping or leading out
        of the mount alike): each comes as a :class:`SkippedLink`, for the sync to name.

        Raises :class:`ResourceError` naming the dataset, the mount and its mountPoint when a mount
        cannot be listed (missing root, unreachable endpoint, bad credentials); secret values are
        removed from the message."""
        for i, mount in enumerate(self.mounts.values()):
            where = f"dataset {self.name!r}: spec.mounts[{i}] ({mount.name!r})"
            try:
                for info in stream_infos(mount.fs, mount.root):
                    ufs_path = info["name"]
                    kind = info.get("type")
                    if kind == "directory" or ufs_path.endswith("/"):  # also "folder/" marker objects
                        path = _namespace_path(mount, ufs_path.rstrip("/"), where)
                        if path:  # not the mount's root (its row comes last)
                            yield FileEntry(path + DIR, mount.name, ufs_path, 0, mtime_of(info), "")
                        continue
                    if kind != "file" and not info.get("islink"):  # sockets, FIFOs, devices
                        continue
                    path = _namespace_path(mount, ufs_path, where)
                    if path is None:
                        continue
                    if info.get("islink"):  # fsspec's local info: type 'other' for every link
                        yield SkippedLink(path, mount.name, ufs_path)
                        continue
                    yield FileEntry(path, mount.name, ufs_path, int(info["size"]),
                                    mtime_of(info), version_of(mount.fs, info))
                if mount.prefix:
                    yield FileEntry(normalize(mount.prefix) + DIR, mount.name, mount.root, 0, 0.0, "")
            except FileNotFoundError:
                raise ResourceError(f"{where}: mountPoint {self.mount_points[mount.name]!r} does not exist in the "
                                    "UFS: fix the mountPoint or create it") from None
            except Exception as err:  # each backend has its own error types (botocore, aiohttp, ...)
                raise ResourceError(redact(f"{where}: cannot list the mountPoint: {type(err).__name__}: {err} "
                                           "(check the mountPoint, its options and credentials)",
                                           self.secrets)) from None

    def stat(self, mount: str, ufs_path: str) -> FileEntry:
        """Fresh metadata of one file (for a per-file refresh). Raises FileNotFoundError."""
        m = self.mounts[mount]
        m.fs.invalidate_cache(ufs_path)
        info = m.fs.info(ufs_path)
        return FileEntry(m.dataset_path(ufs_path), mount, ufs_path, int(info["size"]), mtime_of(info),
                      version_of(m.fs, info))

    def read(self, mount: str, ufs_path: str, version: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of exactly ``version``; see ``versions.read_exact`` for errors.
        Secret values are removed from any error message."""
        try:
            return read_exact(self.mounts[mount].fs, ufs_path, version, start, end, self.policies[mount])
        except OSError as err:
            if self.secrets and err.strerror:
                err.strerror = redact(err.strerror, self.secrets)
            raise


def _namespace_path(mount: UfsMount, ufs_path: str, where: str) -> str | None:
    """The dataset path of ``ufs_path`` in canonical form (``a//b`` and ``a/./b`` are ``a/b``, as
    lookups see them), or None, with a warning naming the file and the fix, for a name the namespace
    cannot hold: one that is not UTF-8 (manifests and S3 keys are UTF-8 only) or has '..' parts."""
    try:
        ufs_path.encode("utf-8")
        return normalize(mount.dataset_path(ufs_path))
    except (UnicodeEncodeError, ValueError) as err:
        why = "its name is not valid UTF-8" if isinstance(err, UnicodeEncodeError) else "its name has '..' parts"
        log.warning("%s: skipped %r: %s (rename it in the UFS to include it)",
                    where, ufs_path.encode("utf-8", "surrogateescape"), why)
        return None
