"""Issue 18 item 1: a source rewritten in place while a block is filled never gives a torn block.

Local/POSIX files have no version id a read can ask for: the version (mtime, size, inode, ctime)
is checked by ``fstat`` before and after the read, and a change in between makes the fill stale
(case C5: the file's metadata is refreshed, the next read gets the new version whole). HTTP
without an ETag is checked the same way with a HEAD after the body.
"""

from __future__ import annotations

import os
import random
import threading
import time

import pytest

from datacache.cache.blocks import block_count, block_range
from datacache.control.observe import store_keys
from datacache.errors import StaleFileError
from support import apply_dataset

KiB = 1 << 10
BLOCK = 64 * KiB
BIG = 256 * KiB  # blocks of the stress test


def _local_dataset(home, src, block_size="64Ki"):
    return apply_dataset(home, "torn", [{"name": "local", "mountPoint": str(src)}], block_size=block_size)


def _stored_blocks(client, entry) -> dict[int, bytes]:
    """Blocks of ``entry``'s version held by the cache, read through the checked store."""
    held = {}
    for i in range(block_count(entry.size, BLOCK)):
        data = client.source.store.get(str(client.source.key(entry, i)))
        if data is not None:
            held[i] = bytes(data)
    return held


def test_rewrite_between_the_two_halves_of_a_read_is_stale_not_cached(datacache_home, tmp_path, monkeypatch):
    """Deterministic: the file is rewritten in place after the first half of the block was read,
    as an in-place write landing mid-read does (the issue's inotify-triggered writer)."""
    src = tmp_path / "src"
    src.mkdir()
    old, new = os.urandom(2 * BLOCK), os.urandom(2 * BLOCK)
    (src / "f.bin").write_bytes(old)
    plane = _local_dataset(datacache_home, src)
    client = plane.open_dataset("torn")
    client.readahead = 0
    entry = client.stat("f.bin")
    real_pread = os.pread
    hooked = []

    def pread_with_a_writer(fd, n, offset):
        if hooked:
            return real_pread(fd, n, offset)
        hooked.append(True)
        first = real_pread(fd, n // 2, offset)
        with open(src / "f.bin", "r+b") as w:  # in place: same inode, same size
            w.write(new)
        return first + real_pread(fd, n - n // 2, offset + n // 2)

    monkeypatch.setattr(os, "pread", pread_with_a_writer)
    try:
        with pytest.raises(StaleFileError, match="changed on disk while it was read"):
            client.read(entry, 0, BLOCK)
    finally:
        monkeypatch.setattr(os, "pread", real_pread)
    assert hooked
    assert _stored_blocks(client, entry) == {}  # nothing kept under the old version's key
    fresh = client.stat("f.bin")  # the stale read refreshed the file's entry (C5)
    assert fresh.version != entry.version
    assert client.read(fresh, 0, 2 * BLOCK) == new
    assert _stored_blocks(client, fresh) == {0: new[:BLOCK], 1: new[BLOCK:]}
    client.close()
    plane.close()


def test_readers_filling_while_a_file_is_rewritten_in_place_never_see_two_versions(datacache_home, tmp_path):
    """Real rewrites: one thread rewrites a file in place, version after version, while readers
    fill its blocks; every read returns one whole version and no stored block mixes two."""
    src = tmp_path / "src"
    src.mkdir()
    size = 4 * BIG
    assert block_count(size, BIG) == 4
    versions = [bytes([v]) * size for v in range(4)]  # a torn block holds two different byte values
    (src / "f.bin").write_bytes(versions[0])
    plane = _local_dataset(datacache_home, src, "256Ki")
    clients = [plane.open_dataset("torn") for _ in range(3)]
    ufs_path = clients[0].stat("f.bin").ufs_path
    stop = threading.Event()
    whole = {v[:BIG] for v in versions}
    counts = {"blocks": 0, "files": 0, "stale": 0, "torn blocks": 0, "mixed files": 0}
    errors: list[BaseException] = []

    def writer():
        # Each version in one write (several writes would leave states mixing two versions that a
        # reader may legitimately see whole: the GIL can pause this thread between them), then a
        # pause: fills land both during and between writes.
        fd = os.open(src / "f.bin", os.O_WRONLY)
        rand = random.Random(18)
        try:
            v = 0
            while not stop.is_set():
                v = (v + 1) % len(versions)
                os.pwrite(fd, versions[v], 0)
                time.sleep(rand.uniform(0.0005, 0.01))
        finally:
            os.close(fd)

    def reader(client):
        try:
            while not stop.is_set():
                entry = client.ufs.stat("local", ufs_path)  # the version now, as a sync takes it
                blocks = []
                try:
                    for i in range(block_count(size, BIG)):
                        blocks.append(bytes(client.source.get(entry, i)))
                except StaleFileError:
                    counts["stale"] += 1
                counts["blocks"] += len(blocks)
                counts["torn blocks"] += sum(b not in whole for b in blocks)
                if len(blocks) == block_count(size, BIG):
                    counts["files"] += 1
                    counts["mixed files"] += b"".join(blocks) not in versions
        except BaseException as err:  # noqa: BLE001 - reported by the test thread
            errors.append(err)

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    time.sleep(6.0)
    stop.set()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert counts["blocks"] > 400 and counts["files"] > 10 and counts["stale"] > 10, counts  # it raced
    assert counts["torn blocks"] == 0 and counts["mixed files"] == 0, counts
    # Every block the cache holds is one whole version's bytes.
    store = clients[0].source.store
    keys = [k for k in store_keys(store) if k.startswith("torn/")]
    assert keys
    for key in keys:
        data = store.get(key)
        assert data is None or bytes(data) in whole, f"stored block {key} mixes versions"
    for c in clients:
        c.close()
    plane.close()
