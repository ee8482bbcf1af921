"""The SSD tier's hit path: a read writes nothing to the index (its access time is batched), yet LRU
eviction still sees it; a block file lost under the index is refetched and stored again; a whole
small file comes back through ``datacache://`` byte for byte; a block cut short or overwritten in
its cache file is corrupt; a block read in pieces for a reader is verified as a whole and sliced exactly, and kept in
pieces when promoted to MEM; orphan block files are swept at most once per grace period; a remembered
index row gone stale is asked again (reads and read-ahead hints alike)."""

from __future__ import annotations

import hashlib
import io
import os
import sqlite3
import time

import fsspec

from datacache.cache.blocks import PIECE, PieceBlock, checksum
from datacache.cache.disk import ORPHAN_GRACE_S, DiskTier
from datacache.cache.memory import MemoryTier
from datacache.cache.tiered import TieredStore
from support import apply_dataset

BLOCK = 256 << 10


def _access_times(path: str) -> dict[str, float]:
    with sqlite3.connect(os.path.join(path, "index.db")) as con:
        return dict(con.execute("SELECT file || '/' || idx, atime FROM blocks"))


def test_a_hit_writes_no_index_row_until_flushed_and_still_counts_for_lru(tmp_path):
    tier = DiskTier(str(tmp_path / "ssd"), 4 * BLOCK, high=0.95, low=0.75)
    data = {k: os.urandom(BLOCK) for k in ("ds/a/0", "ds/b/0", "ds/c/0")}
    try:
        for key, value in data.items():
            assert tier.put(key, value)
        before = _access_times(tier.path)
        got = tier.get("ds/a/0")
        assert checksum(got) == checksum(data["ds/a/0"])
        assert _access_times(tier.path) == before  # no write transaction per read
        # The next put passes the high watermark: eviction flushes the pending access first, so
        # a (read last) stays and the two least recently used blocks go.
        assert tier.put("ds/d/0", os.urandom(BLOCK))
        after = _access_times(tier.path)
        assert after["ds/a/0"] > before["ds/a/0"]
        assert "ds/a/0" in tier and "ds/b/0" not in tier and "ds/c/0" not in tier and "ds/d/0" in tier
        assert tier.flush_accesses() == 0  # nothing left pending
    finally:
        tier.close()


def test_a_block_read_again_soon_is_written_once_until_an_eviction_writes_its_last_use(tmp_path):
    """The hit path's periodic write rewrites a block's access time at most once per
    ACCESS_GRANULARITY_S; an eviction writes every pending use first, so LRU order stays exact
    within the process."""
    tier = DiskTier(str(tmp_path / "ssd"), 4 * BLOCK, high=0.95, low=0.75)
    try:
        for key in ("ds/a/0", "ds/b/0", "ds/c/0"):
            assert tier.put(key, os.urandom(BLOCK))
        assert tier.get("ds/a/0") is not None
        assert tier.flush_accesses(everything=False) == 1  # never written by this process: due
        first = _access_times(tier.path)["ds/a/0"]
        time.sleep(0.01)
        assert tier.get("ds/b/0") is not None and tier.get("ds/a/0") is not None  # a read last
        assert tier.flush_accesses(everything=False) == 1  # b only; a's new use stays pending
        stored = _access_times(tier.path)
        assert stored["ds/a/0"] == first < stored["ds/b/0"]
        assert tier.put("ds/d/0", os.urandom(BLOCK))  # past the high watermark: every pending use written, then LRU
        assert _access_times(tier.path)["ds/a/0"] > stored["ds/b/0"]
        assert "ds/a/0" in tier and "ds/b/0" not in tier and "ds/c/0" not in tier and "ds/d/0" in tier
        assert tier.flush_accesses() == 0
    finally:
        tier.close()


def test_the_periodic_write_leaves_a_use_recorded_less_than_the_granularity_before_and_an_eviction_writes_all(
        tmp_path, monkeypatch):
    """Two processes (tiers) share one index. A use whose block's row already holds one less than
    ACCESS_GRANULARITY_S (here 0.5 s) older (the put's, the other process's) is not written by the
    periodic write; an older one is; the write before an eviction writes every use."""
    from datacache.cache import disk

    monkeypatch.setattr(disk, "ACCESS_GRANULARITY_S", 0.5)
    monkeypatch.setattr(disk, "ACCESS_FLUSH_S", 3600.0)  # no periodic write of the reads' own: only those asked for
    directory = str(tmp_path / "ssd")
    one, other = DiskTier(directory, 8 * BLOCK), DiskTier(directory, 8 * BLOCK)
    try:
        assert one.put("ds/a/0", os.urandom(BLOCK))
        put = _access_times(directory)["ds/a/0"]
        assert one.get("ds/a/0") is not None
        assert one.flush_accesses(everything=False) == 1  # due in this process, but the put's time is recent
        assert _access_times(directory)["ds/a/0"] == put
        time.sleep(0.6)
        assert other.get("ds/a/0") is not None
        assert other.flush_accesses(everything=False) == 1
        written = _access_times(directory)["ds/a/0"]
        assert written >= put + 0.5
        time.sleep(0.6)  # due again in the first process; the other's write is older than that now
        assert one.get("ds/a/0") is not None
        assert one.flush_accesses(everything=False) == 1
        first = _access_times(directory)["ds/a/0"]
        assert first >= written + 0.5
        assert other.get("ds/a/0") is not None
        assert other.flush_accesses(everything=False) == 1  # due in that process: the row is recent
        assert _access_times(directory)["ds/a/0"] == first
        assert other.get("ds/a/0") is not None
        assert other.flush_accesses() == 1  # as before an eviction: written, within the granularity too
        assert _access_times(directory)["ds/a/0"] > first
    finally:
        one.close()
        other.close()


def test_a_lost_block_file_is_a_miss_and_is_stored_again(tmp_path):
    tier = DiskTier(str(tmp_path / "ssd"), 16 * BLOCK)
    value = os.urandom(BLOCK)
    try:
        assert tier.put("ds/a/0", value)
        os.unlink(tier.block_file("ds/a/0"))
        assert tier.get("ds/a/0") is None
        assert tier.healthy and "ds/a/0" not in tier  # its index row went with the file
        assert tier.put("ds/a/0", value)
        assert hashlib.sha256(tier.get("ds/a/0")).digest() == hashlib.sha256(value).digest()
    finally:
        tier.close()


def test_whole_small_files_read_back_exactly(datacache_home, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    files = {f"f{i}.jpg": os.urandom(100_000 + i) for i in range(5)}
    for name, value in files.items():
        (src / name).write_bytes(value)
    plane = apply_dataset(datacache_home, "small", [{"name": "local", "mountPoint": str(src)}])
    fs = fsspec.filesystem("datacache", home=str(plane.home), skip_instance_cache=True)
    try:
        for _ in range(2):  # a fill, then hits from the SSD tier
            for name, value in reversed(files.items()):  # not a name-order scan: no file read ahead
                assert hashlib.sha256(fs.cat_file(f"small/{name}")).digest() == hashlib.sha256(value).digest()
                with fs.open(f"small/{name}", "rb") as f:
                    # cached by cat_file: the version's cache file itself, a plain local file, one hit
                    assert isinstance(f, io.BufferedReader)
                    assert f.read() == value and f.read() == b""
                assert fs.cat_file(f"small/{name}", start=10, end=20) == value[10:20]
        client = fs._client("small")
        hits, misses = client.source.hit_counts()
        assert (hits, misses) == (2 * 3 * len(files) - len(files), len(files))  # 3 opens a pass
    finally:
        fs.close()


def _each_damage_is_dropped(tier: DiskTier, value: bytes, get, damages) -> None:
    """Store ``value`` as ``ds/a/0``, apply each damage to its file in turn: ``get`` must find it
    corrupt, count it and drop it (never return the damaged bytes); it is stored again after."""
    for damage in damages:
        assert tier.put("ds/a/0", value)
        with open(tier.block_file("ds/a/0"), "r+b") as f:
            damage(f)
        before = tier.corrupt
        assert get("ds/a/0") is None
        assert tier.corrupt == before + 1 and "ds/a/0" not in tier
    assert tier.put("ds/a/0", value)


def _flip(f, at: int, value: bytes) -> None:
    f.seek(at)
    f.write(b"\xff" if value[at] != 0xFF else b"\0")


def test_a_truncated_or_overwritten_block_is_corrupt_dropped_and_stored_again(tmp_path):
    tier = DiskTier(str(tmp_path / "ssd"), 16 * BLOCK)
    value = os.urandom(BLOCK)
    try:
        _each_damage_is_dropped(tier, value, tier.get, (lambda f: f.truncate(BLOCK - 1),
                                                        lambda f: _flip(f, 0, value)))
        assert hashlib.sha256(tier.get("ds/a/0")).digest() == hashlib.sha256(value).digest()
    finally:
        tier.close()


def test_a_block_read_in_pieces_is_verified_whole_and_sliced_exactly(tmp_path):
    size = 3 * PIECE + 12345
    tier = DiskTier(str(tmp_path / "ssd"), 64 * PIECE)
    value = os.urandom(size)
    try:
        assert tier.put("ds/a/0", value)
        block = tier.get_pieces("ds/a/0")
        assert isinstance(block, PieceBlock) and len(block) == size
        assert [len(p) for p in block.pieces] == [PIECE, PIECE, PIECE, 12345]
        assert hashlib.sha256(bytes(block)).digest() == hashlib.sha256(value).digest()
        assert block.slice(PIECE, 2 * PIECE) is block.pieces[1]  # a whole piece is handed out, not copied
        for lo, hi in ((0, 1), (PIECE - 3, PIECE + 5), (17, size), (size - 1, size), (3 * PIECE, size), (5, 3 * PIECE)):
            assert bytes(block.slice(lo, hi)) == value[lo:hi], (lo, hi)
        _each_damage_is_dropped(tier, value, tier.get_pieces, (
            lambda f: _flip(f, size - 7, value),  # in the last piece
            lambda f: f.truncate(size - 1), lambda f: _flip(f, 0, value)))
        assert tier.put("ds/s/0", value[:PIECE])  # one piece or less: plain bytes
        assert tier.get_pieces("ds/s/0") == value[:PIECE]
    finally:
        tier.close()


def test_a_block_promoted_to_mem_from_a_piece_read_stays_in_pieces(tmp_path):
    size = 4 * PIECE
    value = os.urandom(size)
    store = TieredStore([MemoryTier(64 * PIECE), DiskTier(str(tmp_path / "ssd"), 64 * PIECE)])
    try:
        assert store.put("ds/a/0", value)
        first = store.get("ds/a/0", pieces=True)  # from disk; seen once
        promoted = store.get("ds/a/0", pieces=True)  # from disk; second access: promoted as is
        assert store.levels[0].used() == size and "ds/a/0" in store.levels[0]
        hit = store.get("ds/a/0", pieces=True)
        assert hit is promoted and isinstance(hit, PieceBlock) and first is not promoted
        assert hit.slice(2 * PIECE, 3 * PIECE) is hit.pieces[2]  # a MEM hit hands a piece out, no copy
        whole = store.get("ds/a/0")  # a whole-block caller (a worker) gets bytes
        assert type(whole) is bytes and hashlib.sha256(whole).digest() == hashlib.sha256(value).digest()
    finally:
        store.close()


def test_orphan_files_are_swept_once_per_grace_period_per_directory(tmp_path):
    path = str(tmp_path / "ssd")
    tier = DiskTier(path, 16 * BLOCK)
    assert tier.put("ds/a/0", os.urandom(BLOCK))
    indexed = tier.block_file("ds/a/0")
    tier.sweeper.join(10)
    tier.close()
    orphan = os.path.join(os.path.dirname(indexed), "0123456789abcdef0123456789abcdef")
    with open(orphan, "wb") as f:  # a cache file whose writer was killed before its index row
        f.write(b"x" * 100)
    old = time.time() - ORPHAN_GRACE_S - 1
    os.utime(orphan, (old, old))
    tier = DiskTier(path, 16 * BLOCK)  # swept moments ago: this open does not walk the files again
    assert tier.sweeper is None and os.path.exists(orphan)
    tier.close()
    stamp = os.path.join(path, ".swept")
    assert os.stat(stamp).st_mode & 0o777 == 0o600
    os.utime(stamp, (old, old))  # the last sweep is a grace period old: the next open sweeps
    tier = DiskTier(path, 16 * BLOCK)
    try:
        tier.sweeper.join(10)
        assert not os.path.exists(orphan) and tier.orphans_removed == 1
        assert os.path.exists(indexed) and tier.get("ds/a/0") is not None
    finally:
        tier.close()


def test_a_remembered_row_gone_stale_in_another_process_never_serves_old_bytes(tmp_path):
    reader, writer = DiskTier(str(tmp_path / "ssd"), 16 * BLOCK), DiskTier(str(tmp_path / "ssd"), 16 * BLOCK)
    old, new = os.urandom(BLOCK), os.urandom(BLOCK)
    try:
        assert reader.put("ds/a/0", old) and reader.get("ds/a/0") == old  # its row is remembered now
        writer.discard("ds/a/0")  # another process evicts it ...
        assert not reader.advise("ds/a/0")
        assert reader.get("ds/a/0") is None and "ds/a/0" not in writer
        assert writer.put("ds/a/0", new)  # ... and stores it again: a new cache file
        assert reader.advise("ds/a/0")  # its new row is remembered by the hint ...
        os.unlink(writer.block_file("ds/a/0"))  # ... and its file lost: a miss, never old bytes
        assert reader.get("ds/a/0") is None and "ds/a/0" not in writer
        assert writer.put("ds/a/0", new)
        assert reader.get("ds/a/0") == new
        writer.discard("ds/a/0")
        assert writer.put("ds/a/0", old) and reader.get("ds/a/0") == old
        assert reader.corrupt == 0 and reader.get("ds/a/0") == writer.get("ds/a/0") == old
    finally:
        reader.close()
        writer.close()
