"""The ThinRuntime engine: what the control plane asks of a thin runtime bound to a Dataset.

As in Fluid, runtimes are built by name through one small factory
(``datacache.stack.engines.engine_for``, which finds this module through entry-point group
``datacache.engines``), and all answer the calls of ``datacache.stack.engines.Engine``; a thin
runtime implements ``setup``/``opener`` (how the Dataset's mounts become filesystems),
``state`` and ``teardown``, and keeps the defaults for the rest. The cache on top (tiers,
blocks, warmup, ``datacache://``, the readers' FUSE mount, status) is the same for every runtime
and stays in the control plane, so a thin runtime gets all of it unchanged.

``ThinEngine``: a ``ThinRuntime`` over its ``ThinRuntimeProfile``: either a Python plugin opens
each mount, or the profile's FUSE command mounts them and the mounted directory is read as local
files (:class:`MountedDirFileSystem`).
"""

from __future__ import annotations

from fsspec.implementations.local import LocalFileSystem

from datacache.api.models import API_VERSION
from datacache.api.engine import Engine, EngineState
from datacache.ufs.plugins import open_plugin_mount
from datacache.ufs.secretfiles import secret_files
from datacache_runtimes.fusecmd import FuseCommand


class MountedDirFileSystem(LocalFileSystem):
    """A FUSE command's mounted directory: local files, versioned by size and mtime.

    As ``file`` they would be versioned ``mtime:size:inode:ctime``, but a FUSE mount's inode numbers are
    its program's own (sshfs numbers files per session), so they change whenever the command
    restarts, and every cached block would be orphaned by a remount or a reboot. Under a protocol
    of its own, ``datacache.ufs.versions`` versions a file by size and mtime (what SFTP-like stores
    offer) and re-checks them after every read, so old and new bytes are still never mixed.
    """

    protocol = ("thin-mount",)


class ThinEngine(Engine):
    """A ThinRuntime (``runtime``) over its ThinRuntimeProfile (``profile``), state under ``home``."""

    def __init__(self, runtime, profile, home: str):
        self.runtime, self.profile, self.home = runtime, profile, home
        meta = runtime.metadata
        self.who = f"thinruntime {meta.namespace}/{meta.name} (thinruntimeprofile {profile.metadata.name!r})"
        self.fuse = FuseCommand(home, meta.namespace, meta.name)

    @property
    def options(self) -> dict:
        """The profile's options overridden by the runtime's (a mount's own override both)."""
        return {**self.profile.spec.options, **self.runtime.spec.options}

    def setup(self, dataset) -> None:
        """Start the profile's FUSE command for ``dataset`` (see :meth:`opener`)."""
        self.opener(dataset)

    def opener(self, dataset):
        """A mount opener for ``dataset``; for a FUSE profile this first makes sure the command
        runs and is mounted (starting or restarting it). Raises ``ResourceError`` as
        :meth:`FuseCommand.ensure` does, or for a secret that cannot be found."""
        spec = self.profile.spec
        if spec.plugin is not None:
            return lambda mount, where: open_plugin_mount(spec.plugin, mount, self.home, where,
                                                          self.options, self.who)
        self.fuse.ensure(spec.fuse, self.config(dataset), self.who)
        local = MountedDirFileSystem()
        return lambda mount, where: (local, self.fuse.mount_dir(mount.path))

    def config(self, dataset) -> dict:
        """The FUSE command's config: mounts (with options and secret file paths), target path."""
        mounts = []
        for i, m in enumerate(dataset.spec.mounts):
            where = f"dataset {dataset.metadata.name!r}: spec.mounts[{i}]"
            mounts.append({"name": m.name, "mountPoint": m.mount_point, "path": m.path,
                           "targetPath": self.fuse.mount_dir(m.path), "readOnly": m.read_only,
                           "options": {**self.options, **m.options},
                           "secretFiles": secret_files(m, self.home, where)})
        return {"apiVersion": API_VERSION, "fileSystemType": self.profile.spec.file_system_type,
                "dataset": {"name": dataset.metadata.name, "namespace": dataset.metadata.namespace},
                "targetPath": self.fuse.target, "runtimeOptions": self.options,
                "accessModes": list(dataset.spec.access_modes), "mounts": mounts}

    def state(self) -> EngineState:
        if self.profile.spec.plugin is not None or self.fuse.running():
            return EngineState()
        return EngineState("NotReady", f"{self.who}: its FUSE command is not running (it starts when the dataset is read)")

    def teardown(self, clean_cache: bool = True) -> None:
        """Stop the FUSE command; the cache on top is the control plane's to remove."""
        self.fuse.stop()


def engine(runtime, profile, home: str) -> ThinEngine:
    """The engine of ThinRuntime ``runtime`` over its ``profile`` (called by
    ``datacache.stack.engines.engine_for``, which finds this module by entry point)."""
    return ThinEngine(runtime, profile, home)


def stop_runtime(runtime, home: str) -> None:
    """Stop whatever ``runtime`` started (its FUSE command); needs no profile, so it works after the
    profile was deleted. Never raises for a runtime that runs nothing."""
    if runtime.kind == "ThinRuntime":
        FuseCommand(home, runtime.metadata.namespace, runtime.metadata.name).stop()
