"""Scrub (``datacache verify``): check the cached blocks of a dataset's file versions against
their recorded checksums, and drop the bad ones so that the next read refetches them.

Issue 17 item 4: a block is checksummed (xxh3-64) when it is filled; reads through the block
tiers check it on every disk read, but bytes handed out as a whole file (kernel passthrough, a
``datacache://`` plain file object) are checked only the first time a process hands the file
out. A scrub reads every stored block once, as ``juicefs warmup --check`` does for its cached
blocks, so damage on the device is found without waiting for a restart.

What it checks: every stored copy of the blocks of the selected file versions, through the same
checked read as ``warmup --check`` (:meth:`TieredStore.check`): in this process's cache, or with
cache workers on every live worker (each reads its own copies, ``POST /v1/verify``). A bad block
is dropped; in a cache file once handed out whole (passed through), dropping one block unlinks the
whole file (see :mod:`datacache.cache.disk`): readers holding it keep their bytes, the next open
reads through the blocks and refetches what is gone. With workers, this node's file-tier copies of
the selected versions are checked too (:meth:`FileTier.verify`).

Nothing is fetched from the UFS: a scrub only drops.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from datacache.cache.blocks import block_range
from datacache.manifest import FileEntry


@dataclass
class FileScrub:
    """One file version's scrub: ``blocks``/``bytes`` checked (block copies: a block held by two
    workers counts twice), ``bad``: indexes of blocks a copy of which failed its checksum,
    ``dropped_bytes``: bytes no longer cached after it (the bad blocks, and the rest of a
    passed-through cache file dropped whole with them); ``copy_failed``: this node's file-tier copy
    failed its check and was dropped (its bytes count in ``dropped_bytes``); ``copies``: file-tier
    copies checked (0 or 1)."""

    path: str
    blocks: int = 0
    bytes: int = 0
    bad: list[int] = field(default_factory=list)
    dropped_bytes: int = 0
    copy_failed: bool = False
    copies: int = 0


@dataclass
class ScrubResult:
    """A scrub's outcome: ``files`` (versions with something cached), ``errors`` (targets that
    name nothing, workers that could not check their blocks), ``copies``: file-tier copies checked."""

    files: list[FileScrub]
    errors: list[str]
    copies: int = 0

    def total(self, name: str) -> int:
        """Sum over files of ``blocks``, ``bytes`` or ``dropped_bytes``; ``bad``: bad blocks."""
        return sum(len(f.bad) if name == "bad" else getattr(f, name) for f in self.files)

    @property
    def damaged(self) -> list[FileScrub]:
        """The files that lost something: a bad block, or a failed file-tier copy."""
        return [f for f in self.files if f.bad or f.copy_failed]


def scrub(client, targets: list[str] | None = None) -> ScrubResult:
    """Check ``targets`` (dataset paths, directories or globs; default the whole dataset) of
    ``client`` (a DatasetClient) as the module docstring says. Never raises for a target that
    names nothing, nor for a worker that cannot check its copies: they are in ``errors``. Raises
    ``OSError`` from a failing file tier."""
    entries: dict[str, FileEntry] = {}
    errors = []
    for target in targets or [""]:
        try:
            found = client.manifest.select(target)
        except ValueError as err:
            errors.append(str(err))
            continue
        if not found and not client.manifest.is_dir(target):
            errors.append(f"{target}: no such file, directory or match in dataset {client.name!r} as of its "
                          "last metadata sync")
        entries.update((e.path, e) for e in found)
    tier = None if getattr(client.source, "local_file", None) else client.files  # workers: this node's copies
    files = []
    for entry in entries.values():
        result = FileScrub(entry.path)
        try:
            _scrub_blocks(client, entry, result)
        except OSError as err:  # a worker that could not check its copies (the others did)
            errors.append(str(err))
        if tier is not None:
            _scrub_copy(tier, client.source, entry, result)
        files.append(result)
    return ScrubResult([f for f in files if f.blocks or f.copies], errors, copies=sum(f.copies for f in files))


def _scrub_blocks(client, entry: FileEntry, result: FileScrub) -> None:
    """Check every stored copy of ``entry``'s blocks once through the checked read, into ``result``."""
    before = client.cached_file_bytes(entry)
    if not before:
        return
    copies = client.source.verify(entry)
    result.blocks = len(copies)
    result.bytes = sum(_length(entry, i, client.block_size) for i, _ in copies)
    result.bad = sorted({i for i, ok in copies if not ok})
    if result.bad:
        result.dropped_bytes = max(before - client.cached_file_bytes(entry), 0)


def _scrub_copy(tier, source, entry: FileEntry, result: FileScrub) -> None:
    """Check this node's file-tier copy of ``entry``'s version, if there is one, into ``result``."""
    fid = source.key(entry, 0).file_id
    if tier.contains(fid):
        result.copies += 1
        if tier.verify(fid):
            result.copy_failed = True
            result.dropped_bytes += entry.size


def _length(entry: FileEntry, index: int, block_size: int) -> int:
    start, end = block_range(index, entry.size, block_size)
    return end - start
