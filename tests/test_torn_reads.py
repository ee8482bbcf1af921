"""Issue 18 item 1: a source rewritten in place while a block is filled never gives a torn block.

Local/POSIX files have no version id a read can ask for: the version (mtime, size, inode, ctime)
is checked by ``fstat`` before and after the read, and a change in between makes the fill stale
(case C5: the file's metadata is refreshed, the next read gets the new version whole). HTTP
without an ETag is checked the same way with a HEAD after the body.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import random
import threading
import time
from hashlib import sha256

import pytest

from datacache.cache.blocks import block_count
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


def _race(clients, ufs_path: str, nblocks: int, write_next, on_blocks, seconds: float = 6.0) -> dict:
    """Run ``write_next()`` in a loop in one thread (a short random pause after each call) while
    each client's thread takes the file's version as a sync would and reads its ``nblocks``
    blocks through the block source, calling ``on_blocks(entry, blocks)`` with the blocks read
    before a version change made the read stale. Runs ``seconds``, longer (up to 10x) until it
    raced enough on a loaded machine. Returns the counters."""
    stop = threading.Event()
    counts = {"blocks": 0, "files": 0, "stale": 0}
    errors: list[BaseException] = []

    def writer():
        rand = random.Random(18)
        while not stop.is_set():
            write_next()
            time.sleep(rand.uniform(0.0005, 0.01))  # fills land both during and between writes

    def reader(client):
        try:
            while not stop.is_set():
                entry = client.ufs.stat("local", ufs_path)
                blocks = []
                try:
                    for i in range(nblocks):
                        blocks.append(bytes(client.source.get(entry, i)))
                except StaleFileError:
                    counts["stale"] += 1
                counts["blocks"] += len(blocks)
                counts["files"] += len(blocks) == nblocks
                on_blocks(entry, blocks)
        except BaseException as err:  # noqa: BLE001 - reported by the test thread
            errors.append(err)

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    time.sleep(seconds)
    deadline = time.monotonic() + 9 * seconds
    while not _raced(counts) and time.monotonic() < deadline:
        time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert _raced(counts), counts
    return counts


def _raced(counts: dict) -> bool:
    return counts["blocks"] > 400 and counts["files"] > 10 and counts["stale"] > 10


def _racing_dataset(home, src, data: bytes):
    (src / "f.bin").write_bytes(data)
    plane = _local_dataset(home, src, "256Ki")
    clients = [plane.open_dataset("torn") for _ in range(3)]
    return plane, clients, clients[0].stat("f.bin").ufs_path


def test_readers_filling_while_a_file_is_rewritten_in_place_never_see_two_versions(datacache_home, tmp_path):
    """Real rewrites: one thread rewrites a file in place with whole versions (open, one
    ``pwrite``, close each) while three readers fill its blocks; every block and every whole read
    is one version, and so is every block the cache holds. (With the version checked only by
    ``fstat`` before and after each read, a write already copying when the version was taken
    gave 3 torn blocks in one CI run: the lease probe now sees its writer.)"""
    src = tmp_path / "src"
    src.mkdir()
    size = 4 * BIG
    versions = [bytes([v]) * size for v in range(4)]  # a torn block holds two different byte values
    whole = {v[:BIG] for v in versions}
    plane, clients, ufs_path = _racing_dataset(datacache_home, src, versions[0])
    turn = [0]
    bad = {"torn blocks": 0, "mixed files": 0}

    def write_next():
        turn[0] += 1
        fd = os.open(src / "f.bin", os.O_WRONLY)
        try:
            os.pwrite(fd, versions[turn[0] % len(versions)], 0)
        finally:
            os.close(fd)

    def on_blocks(entry, blocks):
        bad["torn blocks"] += sum(b not in whole for b in blocks)
        bad["mixed files"] += len(blocks) == 4 and b"".join(blocks) not in versions

    _race(clients, ufs_path, 4, write_next, on_blocks)
    assert bad == {"torn blocks": 0, "mixed files": 0}
    store = clients[0].source.store
    keys = [k for k in store_keys(store) if k.startswith("torn/")]
    assert keys
    for key in keys:
        data = store.get(key)
        assert data is None or bytes(data) in whole, f"stored block {key} mixes versions"
    for c in clients:
        c.close()
    plane.close()


def test_blocks_read_under_a_version_are_that_versions_bytes_with_a_two_write_writer(datacache_home, tmp_path):
    """The issue's writer: each version written in two writes, the second half first, so the
    file also passes through states mixing two versions (each with its own ctime). Whatever
    state a reader took the version of, every block it got, and every block the cache holds
    under that version's key, is that state's bytes (before the fix: blocks cached under the old
    version's key held bytes written after it: 2-3 of ~3,000 block reads here)."""
    src = tmp_path / "src"
    src.mkdir()
    size = 4 * BIG
    half = size // 2
    state = bytearray(size)
    plane, clients, ufs_path = _racing_dataset(datacache_home, src, bytes(state))
    ufs = clients[0].ufs
    digests: dict[str, list[str]] = {}  # version -> sha256 of each of its blocks

    def record():
        digests[ufs.stat("local", ufs_path).version] = [sha256(state[i:i + BIG]).hexdigest()
                                                         for i in range(0, size, BIG)]

    record()
    turn = [0]
    got: list[tuple[str, int, str]] = []  # (version, block index, sha256) of every block read

    def write_next():
        turn[0] += 1
        fd = os.open(src / "f.bin", os.O_WRONLY)
        try:
            for lo in (half, 0):  # as the writer: the later part first
                state[lo:lo + half] = bytes([turn[0] % 256]) * half
                os.pwrite(fd, state[lo:lo + half], lo)
                record()  # the writer's own stat: the next write gets a new ctime
        finally:
            os.close(fd)

    def on_blocks(entry, blocks):
        got.extend((entry.version, i, sha256(b).hexdigest()) for i, b in enumerate(blocks))

    _race(clients, ufs_path, 4, write_next, on_blocks)
    wrong = [(v, i) for v, i, digest in got if digests[v][i] != digest]
    assert not wrong, f"{len(wrong)} of {len(got)} blocks are not the bytes of the version they were read as"
    entry = clients[0].stat("f.bin")
    store = clients[0].source.store
    held = 0
    for version, blocks in digests.items():
        for i, digest in enumerate(blocks):
            data = store.get(str(clients[0].source.key(dataclasses.replace(entry, version=version), i)))
            held += data is not None
            assert data is None or sha256(bytes(data)).hexdigest() == digest, "a stored block mixes versions"
    assert held
    for c in clients:
        c.close()
    plane.close()


def test_a_file_open_for_writing_elsewhere_is_read_but_never_stored(datacache_home, tmp_path):
    """A writer's open file is what a write still copying its bytes needs, and no ``fstat`` can
    tell such a write from its end: while any process holds the file open for writing, reads
    return its bytes (as a direct read would) and store none, a warmup names the file and why;
    once it is closed the next read is cached."""
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(2 * BLOCK)
    (src / "f.bin").write_bytes(data)
    plane = _local_dataset(datacache_home, src)
    client = plane.open_dataset("torn")
    client.readahead = 0
    entry = client.stat("f.bin")
    writer = os.open(src / "f.bin", os.O_WRONLY)  # a logger's or trainer's open file
    try:
        assert client.read(entry, 0, 2 * BLOCK) == data
        assert _stored_blocks(client, entry) == {}
        with pytest.raises(OSError, match="open for writing") as err:
            client.source.fill(entry, 0, 1)
        assert err.value.errno == errno.EBUSY and err.value.filename == "f.bin"
        assert _stored_blocks(client, entry) == {}
    finally:
        os.close(writer)
    assert client.read(entry, 0, 2 * BLOCK) == data
    assert _stored_blocks(client, entry) == {0: data[:BLOCK], 1: data[BLOCK:]}
    client.close()
    plane.close()
