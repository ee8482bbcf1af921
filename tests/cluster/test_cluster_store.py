"""The worker's disk tier: a block served by sendfile (at its offset in its file version's cache file)
still counts as used for LRU eviction, although the lookup writes nothing (the access times are
written in one batch); a block evicted while being sent reads whole, or (a hole punched in a file
still filling) fails the checksum the client checks, never passes it with other bytes."""

from __future__ import annotations

import os

from datacache.cache.blocks import checksum
from datacache.cluster.store import ServingDiskTier

BLOCK = 256 << 10


def test_blocks_served_count_as_recently_used_once_flushed(tmp_path):
    tier = ServingDiskTier(str(tmp_path / "w"), 4 * BLOCK, high=0.95, low=0.75)
    data = {k: os.urandom(BLOCK) for k in ("ds/a/0", "ds/b/0", "ds/c/0")}
    try:
        for key in ("ds/a/0", "ds/b/0", "ds/c/0"):
            assert tier.put(key, data[key])
        f, offset, size, digest = tier.open_block("ds/a/0")  # a served: without the flush it would go first
        with f:
            assert checksum(os.pread(f.fileno(), size, offset)) == digest == checksum(data["ds/a/0"])
        assert tier.open_block("ds/missing/0") is None

        assert tier.flush_accesses() == 1 and tier.flush_accesses() == 0
        assert tier.put("ds/d/0", os.urandom(BLOCK))  # past the high watermark: two blocks go
        assert "ds/a/0" in tier and "ds/b/0" not in tier and "ds/c/0" not in tier and "ds/d/0" in tier
        assert bytes(tier.get("ds/a/0")) == data["ds/a/0"]
    finally:
        tier.close()


def test_a_block_evicted_while_being_sent_still_reads_whole(tmp_path):
    tier = ServingDiskTier(str(tmp_path / "w"), 4 * BLOCK)
    data = os.urandom(BLOCK)
    try:
        assert tier.put("ds/a/0", data)
        f, offset, size, digest = tier.open_block("ds/a/0")
        tier.discard("ds/a/0")  # its file's only block: the file is unlinked
        with f:
            assert os.pread(f.fileno(), size, offset) == data and digest == checksum(data)
        assert tier.open_block("ds/a/0") is None
    finally:
        tier.close()


def test_a_block_punched_out_while_being_sent_fails_its_checksum(tmp_path):
    tier = ServingDiskTier(str(tmp_path / "w"), 16 * BLOCK, block_size=BLOCK)
    blocks = [os.urandom(BLOCK) for _ in range(3)]
    try:
        for i, value in enumerate(blocks):
            assert tier.put(f"ds/{'f' * 32}/{i}", value)
        f, offset, size, digest = tier.open_block(f"ds/{'f' * 32}/1")
        assert (offset, size, digest) == (BLOCK, BLOCK, checksum(blocks[1]))
        tier.discard(f"ds/{'f' * 32}/1")  # a file never handed out whole: a hole is punched
        with f:
            sent = os.pread(f.fileno(), size, offset)
        assert sent == bytes(BLOCK) and checksum(sent) != digest  # the client rejects it
        assert tier.open_block(f"ds/{'f' * 32}/1") is None
        assert [tier.get(f"ds/{'f' * 32}/{i}") for i in (0, 2)] == [blocks[0], blocks[2]]
        assert os.stat(tier.block_file(f"ds/{'f' * 32}/0")).st_blocks * 512 == 2 * BLOCK  # the hole holds no space
    finally:
        tier.close()
