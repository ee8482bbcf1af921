"""File tier benchmark (issue 17): the file tier's copy of a version (used with cache workers) read as
a plain file, against the same version read block by block from the disk tier (4 MiB blocks, since
issue 17 item 4 at their offsets in one cache file per version), side by side, ratios printed.

Run from the repository root, as root (it drops the page cache)::

    python -m benchmarks.filetier_read [--quick] [--repeat 3] [--dir /var/tmp]

Data: a file of random bytes (1 GiB; ``--quick``: 128 MiB) stored as blocks in a
:class:`~datacache.cache.disk.DiskTier` (every block checksummed), then materialized into a
:class:`~datacache.cache.filetier.FileTier` from those blocks; all under one temporary directory
on ``--dir``'s file system, removed at the end.

Rows (median of ``--repeat`` passes, spread min-max, and the ratio of the best passes too: on a
shared machine the median moves with the neighbours' I/O; the sides alternate within each round):

- **read, page cache dropped** (``sync; echo 3 > /proc/sys/vm/drop_caches`` before each side) and
  **read, warm** (each side read once untimed first): the file tier's file read with
  ``readinto()`` of one 1 MiB buffer until EOF, against every block through
  ``DiskTier.get_pieces`` (the block tier's read for a reader: checksum verified, pieces of 1 MiB);
- **materialize**: ``FileTier.materialize`` from ``DiskTier.get_pieces`` with the block files in
  the page cache (warm) and with it dropped (cold), in GB/s of file written.

Host cache: on a VM, the host caches the virtual disk too, which ``drop_caches`` in the guest
does not reach. A file just written reads cold from the host (a plain ``dd`` of a fresh 1 GiB
file here: 270 MB/s, then 1.5 GB/s once read once), so each side is read once, untimed, before the
page-cache-dropped rounds: both then start with the host's cache in the same state.

Figures are the whole path each side takes on this machine (two shared CPUs: expect noise; the
spread column shows it).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import tempfile

from benchmarks.common import MB, format_table, spread, summarize, timed
from benchmarks.fuse_read import drop_caches, read_paths
from datacache.cache.blocks import file_id
from datacache.cache.disk import DiskTier
from datacache.cache.filetier import FileTier

MiB = 1 << 20
BLOCK = 4 * MiB


def build_blocks(disk: DiskTier, size: int) -> tuple[list[str], str]:
    """Store ``size`` random bytes as blocks; returns ``(block keys in order, sha256 of the bytes)``."""
    digest, keys = hashlib.sha256(), []
    fid = file_id("bench", "large.bin", "v1", BLOCK)
    for i in range(0, size, BLOCK):
        data = os.urandom(min(BLOCK, size - i))
        digest.update(data)
        key = f"bench/{fid}/{i // BLOCK}"
        if not disk.put(key, data):
            raise SystemExit(f"the block tier under {disk.path} refused block {key}: is the disk full?")
        keys.append(key)
    return keys, digest.hexdigest()


def read_blocks(disk: DiskTier, keys: list[str]) -> tuple[int, int]:
    total = 0
    for key in keys:
        block = disk.get_pieces(key)
        if block is None:
            raise AssertionError(f"block {key} missing or corrupt")
        total += len(block)
    return total, len(keys)


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 * MiB):
            h.update(chunk)
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="128 MiB instead of 1 GiB")
    parser.add_argument("--repeat", type=int, default=3, help="timed passes per row (default 3)")
    parser.add_argument("--dir", default="/var/tmp", help="where the temporary cache directories go")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("run as root: the page-cache-dropped rows write /proc/sys/vm/drop_caches")
    size = (128 if args.quick else 1024) * MiB
    top = tempfile.mkdtemp(prefix="datacache-filetier-", dir=args.dir)
    disk = tier = None
    try:
        disk = DiskTier(os.path.join(top, "blocks"), 2 * size)
        keys, want = build_blocks(disk, size)
        tier = FileTier(os.path.join(top, "files"), size + size // 2)  # room for one file: each pass evicts the last

        def materialize(n: int):
            path = tier.materialize(file_id("bench", "large.bin", f"pass{n}", BLOCK), size,
                                    (disk.get_pieces(k) for k in keys))
            return os.path.getsize(path), 1

        rows = {name: [] for name in ("materialize, blocks warm", "materialize, blocks cold")}
        read_blocks(disk, keys)  # the blocks into the page cache
        for n in range(args.repeat):
            rows["materialize, blocks warm"].append(timed(lambda n=n: materialize(n)))
        for n in range(args.repeat):
            drop_caches()
            rows["materialize, blocks cold"].append(timed(lambda n=n: materialize(args.repeat + n)))
        path = tier.path(file_id("bench", "large.bin", f"pass{2 * args.repeat - 1}", BLOCK))
        if file_sha256(path) != want:
            raise AssertionError("the materialized file differs from its blocks")

        reads = {(m, s): [] for m in ("dropped", "warm") for s in ("file tier", "block tier")}
        sides = {"file tier": lambda: read_paths([path], MiB), "block tier": lambda: read_blocks(disk, keys)}
        for side in sides:  # once untimed: see "host cache" in the module docstring
            sides[side]()
        for n in range(args.repeat):
            order = list(sides) if n % 2 == 0 else list(reversed(sides))
            for side in order:
                drop_caches()
                reads["dropped", side].append(timed(sides[side]))
        for side in sides:
            sides[side]()  # warm: every side read once, untimed
        for n in range(args.repeat):
            for side in sides:
                reads["warm", side].append(timed(sides[side]))

        table = []
        for mode in ("dropped", "warm"):
            f, b = (summarize(reads[mode, s]) for s in ("file tier", "block tier"))
            fb, bb = (summarize(reads[mode, s], "best") for s in ("file tier", "block tier"))
            table.append([f"read 1 file, page cache {mode}", f"{f.mb_s:.0f} ({spread(reads[mode, 'file tier'])})",
                          f"{b.mb_s:.0f} ({spread(reads[mode, 'block tier'])})", f"{f.mb_s / b.mb_s:.2f}x",
                          f"{fb.mb_s / bb.mb_s:.2f}x"])
        print(f"file of {size // MiB} MiB, blocks of {BLOCK // MiB} MiB, median of {args.repeat} (min-max)\n")
        print(format_table(["row", "file tier MB/s", "block tier MB/s", "file/block", "best/best"], table,
                           right=(1, 2, 3, 4)))
        print()
        print(format_table(["materialize", "GB/s (min-max MB/s)", "CPU s"],
                           [[name, f"{summarize(s).mb_s * MB / 1e9:.2f} ({spread(s)})", f"{summarize(s).cpu:.2f}"]
                            for name, s in rows.items()], right=(1, 2)))
        return 0
    finally:
        for closable in (tier, disk):
            if closable is not None:
                closable.close()
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
