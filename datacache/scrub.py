"""Scrub (``datacache verify``): check the cached blocks of a dataset's file versions against
their recorded checksums, and drop the bad ones so that the next read refetches them.

Issue 17 item 4: a block is checksummed (xxh3-64) when it is filled; reads through the block
tiers check it on every disk read, but bytes handed out as a whole file (kernel passthrough, a
``datacache://`` plain file object) are checked only the first time a process hands the file
out. A scrub reads every stored block once, as ``juicefs warmup --check`` does for its cached
blocks, so damage on the device is found without waiting for a restart.

What it checks, by block source:
- in-process (``LocalBlockSource``): every stored block of the selected file versions, through
  the same checked read as ``warmup --check`` (:meth:`TieredStore.verify`). A bad block is dropped;
  in a cache file once handed out whole (passed through), dropping one block unlinks the whole file
  (see :mod:`datacache.cache.disk`): readers holding it keep their bytes, the next open reads
  through the blocks and refetches what is gone;
- cache workers (``ClusterBlockSource``): this node's file tier copies of the selected versions
  (:meth:`FileTier.verify`); the workers' blocks are not read here (``warmup --check`` has each
  worker check, and reload, its own).

Nothing is fetched from the UFS: a scrub only drops.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from datacache.cache.blocks import block_count, block_range
from datacache.manifest import FileEntry


@dataclass
class FileScrub:
    """One file version's scrub: ``blocks``/``bytes`` checked, ``bad``: indexes of blocks that
    failed their checksum, ``dropped_bytes``: bytes no longer cached after it (the bad blocks,
    and the rest of a passed-through cache file dropped whole with them); for a worker runtime,
    ``whole``: a file-tier copy was checked, ``copy_failed``: it failed and was dropped."""

    path: str
    blocks: int = 0
    bytes: int = 0
    bad: list[int] = field(default_factory=list)
    dropped_bytes: int = 0
    whole: bool = False
    copy_failed: bool = False


@dataclass
class ScrubResult:
    """A scrub's outcome: ``files`` (versions with something cached), ``errors`` (targets that
    name nothing), ``blocks_on_workers``: True when the blocks live on cache workers (not read)."""

    files: list[FileScrub]
    errors: list[str]
    blocks_on_workers: bool = False

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
    names nothing: it is in ``errors``. Raises ``OSError`` from a failing cache directory."""
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
    source = client.source
    if not hasattr(source, "verify"):  # cache workers: this node's whole-file copies only
        tier = client.files
        files = [] if tier is None else [_scrub_copy(tier, source, e) for e in entries.values()]
        return ScrubResult([f for f in files if f.whole], errors, blocks_on_workers=True)
    files = [_scrub_blocks(client, e) for e in entries.values()]
    return ScrubResult([f for f in files if f.blocks], errors)


def _scrub_blocks(client, entry: FileEntry) -> FileScrub:
    """Read every stored block of ``entry``'s version once through the checked path."""
    source, bs = client.source, client.block_size
    result = FileScrub(entry.path)
    held = [i for i in range(block_count(entry.size, bs)) if source.is_cached(entry, i)]
    before = sum(_length(entry, i, bs) for i in held)
    for i in held:
        ok = source.verify(entry, i)
        if ok is None:  # gone meanwhile: evicted, or dropped with its whole file
            continue
        result.blocks += 1
        result.bytes += _length(entry, i, bs)
        if not ok:
            result.bad.append(i)
    if result.bad:
        result.dropped_bytes = max(before - client.cached_file_bytes(entry), 0)
    return result


def _scrub_copy(tier, source, entry: FileEntry) -> FileScrub:
    """Check the file tier's copy of ``entry``'s version, if it holds one."""
    fid = source.key(entry, 0).file_id
    result = FileScrub(entry.path, whole=tier.contains(fid))
    if result.whole:
        result.blocks, result.bytes = block_count(entry.size, source.block_size), entry.size
        if tier.verify(fid):
            result.copy_failed, result.dropped_bytes = True, entry.size
    return result


def _length(entry: FileEntry, index: int, block_size: int) -> int:
    start, end = block_range(index, entry.size, block_size)
    return end - start
