"""Block keys and block math.

A file is cut into fixed-size blocks (default 4 MiB). A block's key names the dataset, the exact
file version and the block size, so an object overwritten in the UFS gets new keys and can never
be served from old blocks; the old ones simply age out of the LRU (the JuiceFS/Alluxio idea of
immutable, content-version-addressed chunks).
"""

from __future__ import annotations

from dataclasses import dataclass

import xxhash


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
