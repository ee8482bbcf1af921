"""Block keys and block math.

A file is cut into fixed-size blocks (default 4 MiB). A block's key names the dataset, the exact
file version and the block size, so an object overwritten in the UFS gets new keys and can never
be served from old blocks; the old ones simply age out of the LRU (the JuiceFS/Alluxio idea of
immutable, content-version-addressed chunks).
"""

from __future__ import annotations

from dataclasses import dataclass

import xxhash

PIECE = 1 << 20  # bytes per piece of a block read for a reader (FUSE's request size, a loader's read())


@dataclass(frozen=True)
class BlockKey:
    """One block of one file version.

    ``dataset``: dataset name; ``file_id``: 32 hex chars identifying (mount, ufs path, version,
    block size); ``index``: block number from 0. ``str(key)`` is ``dataset/file_id/index``, the key
    used in every store and on the wire.
    """

    dataset: str
    file_id: str
    index: int

    def __str__(self) -> str:
        return f"{self.dataset}/{self.file_id}/{self.index}"

    @classmethod
    def parse(cls, text: str) -> "BlockKey":
        """Inverse of ``str(key)``. Raises ``ValueError`` on a malformed key."""
        dataset, file_id, index = text.split("/")
        if len(file_id) != 32 or not index.isdigit():
            raise ValueError(f"malformed block key {text!r}")
        int(file_id, 16)
        return cls(dataset, file_id, int(index))


def file_id(mount: str, ufs_path: str, version: str, block_size: int) -> str:
    """Stable 128-bit id (hex) of one version of one UFS file cut at ``block_size`` bytes."""
    return xxhash.xxh3_128_hexdigest(f"{mount}\0{ufs_path}\0{version}\0{block_size}".encode())


def block_count(size: int, block_size: int) -> int:
    """Number of blocks of a file of ``size`` bytes (0 for an empty file)."""
    return -(-size // block_size)


def block_range(index: int, size: int, block_size: int) -> tuple[int, int]:
    """Byte range ``[start, end)`` of block ``index`` of a file of ``size`` bytes."""
    start = index * block_size
    return start, min(start + block_size, size)


def checksum(data: bytes | memoryview) -> str:
    """Checksum stored with every block (xxh3-64, hex): fast enough to verify on every disk read."""
    return xxhash.xxh3_64_hexdigest(data)


class PieceBlock:
    """A block held as consecutive ``bytes`` pieces of :data:`PIECE` bytes (the last may be
    shorter), as the disk tier reads it for a reader: a read of exactly one piece is that piece
    itself, with no copy, where slicing one 4 MiB ``bytes`` costs a copy per ``read()``.

    ``len(block)`` is its size in bytes; ``bytes(block)`` joins the pieces (a copy)."""

    __slots__ = ("pieces", "_size")

    def __init__(self, pieces: tuple[bytes, ...]):
        self.pieces = pieces
        self._size = sum(map(len, pieces))

    def __len__(self) -> int:
        return self._size

    def __bytes__(self) -> bytes:
        return b"".join(self.pieces)

    def slice(self, lo: int, hi: int) -> bytes | memoryview:
        """Bytes ``[lo, hi)`` of the block (``0 <= lo < hi <= len(block)``): a whole piece as is,
        a read-only view inside one piece, or a copy joining the parts of several."""
        first, last = lo // PIECE, (hi - 1) // PIECE
        if first == last:
            piece, base = self.pieces[first], first * PIECE
            if lo == base and hi - base == len(piece):
                return piece
            return memoryview(piece)[lo - base:hi - base]
        return b"".join(memoryview(self.pieces[i])[max(lo - i * PIECE, 0):hi - i * PIECE]
                        for i in range(first, last + 1))


def block_slice(block, lo: int, hi: int) -> bytes | memoryview:
    """Bytes ``[lo, hi)`` of a block (``bytes``, a ``memoryview`` or a :class:`PieceBlock`) with
    no copy where one can be avoided: a read-only view, or a whole piece."""
    if isinstance(block, PieceBlock):
        return block.slice(lo, hi)
    return memoryview(block).toreadonly()[lo:hi]
