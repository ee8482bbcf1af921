"""The worker's disk tier: a block served by sendfile still counts as used for LRU eviction, although
the lookup writes nothing (the access times are written in one batch)."""

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
        f, digest = tier.open_block("ds/a/0")  # a served: without the flush it would go first
        with f:
            assert checksum(f.read()) == digest == checksum(data["ds/a/0"])
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
        f, digest = tier.open_block("ds/a/0")
        tier.discard("ds/a/0")
        with f:
            assert f.read() == data and digest == checksum(data)
        assert tier.open_block("ds/a/0") is None
    finally:
        tier.close()
