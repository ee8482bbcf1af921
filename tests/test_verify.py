"""``datacache verify`` (issue 17 item 4): the scrub reads every cached block, drops those whose
bytes no longer match the checksum recorded when they were stored, names them, and fetches
nothing; the next read refetches exactly what was dropped (counted by the UFS bytes read)."""

from __future__ import annotations

import hashlib
import os

import pytest

from datacache.api.quantity import format_bytes
from datacache.cache.blocks import block_count, block_range
from datacache.control.embedded import Embedded
from datacache.fs import DatacacheFileSystem
from support import dataset_yaml, s3_mount
from test_cli import dc

BLOCK = 64 << 10
SIZES = {"a.bin": 10 * BLOCK, "sub/b.bin": 10 * BLOCK - 1000, "c.bin": 3 * BLOCK + 1}  # 24 blocks


@pytest.fixture
def warmed(datacache_home, s3_bucket, moto_server, moto_secrets, tmp_path):
    """Dataset ``vfy`` on moto's S3, warmed up through the CLI: ``{path: bytes}``."""
    fs, bucket = s3_bucket
    files = {path: os.urandom(size) for path, size in SIZES.items()}
    fs.pipe({f"{bucket}/{path}": data for path, data in files.items()})
    (tmp_path / "ds.yaml").write_text(dataset_yaml("vfy", [s3_mount(moto_server, bucket)],
                                                   [{"mediumtype": "SSD", "path": "cache", "quota": "64Mi"}],
                                                   block_size="64Ki"))
    dc("apply", "-f", str(tmp_path / "ds.yaml"), home=datacache_home, check=True)
    dc("warmup", "-q", "vfy", home=datacache_home, check=True)
    return files


def _damage(home, path: str, index: int, expose: bool = False) -> int:
    """Flip one byte of block ``index`` of ``path`` in its cache file, found through the disk
    tier's index (``expose``: hand the version out whole first, as a passthrough open does);
    returns the block's length."""
    client = Embedded(str(home)).open_dataset("vfy")
    try:
        entry = client.stat(path)
        if expose:
            os.close(client.source.local_file(entry))
        (disk,) = client.source.store.levels
        cache_file, offset, length, _ = disk.block_extent(str(client.source.key(entry, index)))
    finally:
        client.close()
    start, end = block_range(index, entry.size, BLOCK)
    assert (offset, length) == (start, end - start)
    with open(cache_file, "r+b") as f:  # same size, one other byte: only the checksum tells
        f.seek(offset + 17)
        byte = f.read(1)
        f.seek(offset + 17)
        f.write(bytes([byte[0] ^ 0xFF]))
    return length


def test_verify_drops_exactly_the_damaged_blocks_and_the_next_read_refetches_them(warmed, datacache_home):
    total_blocks = sum(block_count(s, BLOCK) for s in SIZES.values())
    r = dc("verify", "vfy", home=datacache_home)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.decode().splitlines() == [
        f"dataset.datacache.io/vfy verified: {total_blocks} blocks ({format_bytes(sum(SIZES.values()))}) of 3 files "
        "checked, "
        "0 blocks failed the checksum, 0B dropped"]

    b_block = _damage(datacache_home, "sub/b.bin", 5)  # never handed out whole: only its block goes
    _damage(datacache_home, "a.bin", 2, expose=True)  # passed through once: its whole file goes
    r = dc("verify", "vfy", "sub", home=datacache_home)  # PATHS: only what is under them is read
    out = r.stdout.decode().splitlines()
    assert r.returncode == 1 and out[0].startswith("dataset.datacache.io/vfy verified: 10 blocks "), out
    assert out[1] == (f"  sub/b.bin: block 5 failed the checksum: dropped {format_bytes(b_block)} (the next read "
                      "fetches it again)")
    r = dc("verify", "vfy", home=datacache_home)
    out = r.stdout.decode().splitlines()
    assert r.returncode == 1, out
    # b's block 5 is gone already; a's block 2 fails, and its whole exposed file is unlinked with it
    checked = sum(SIZES.values()) - b_block - 7 * BLOCK  # a's blocks 3..9 went with its file, unread
    a = format_bytes(SIZES["a.bin"])
    assert out[0] == (f"dataset.datacache.io/vfy verified: {total_blocks - 1 - 7} blocks ({format_bytes(checked)}) "
                      f"of 3 files checked, 1 block failed the checksum, {a} dropped"), out
    assert out[1:] == [f"  a.bin: block 2 failed the checksum: dropped {a} (the next read fetches it again)"]
    assert dc("verify", "vfy", home=datacache_home).returncode == 0  # nothing bad is left

    fs = DatacacheFileSystem(home=str(datacache_home), skip_instance_cache=True)
    try:
        for path, data in warmed.items():
            with fs.open(f"datacache://vfy/{path}", "rb") as f:
                assert hashlib.sha256(f.read()).hexdigest() == hashlib.sha256(data).hexdigest(), path
        assert fs._client("vfy").source.ufs_bytes == b_block + SIZES["a.bin"]  # exactly what was dropped
    finally:
        fs.close()


def test_verify_names_a_path_that_matches_nothing(warmed, datacache_home):
    r = dc("verify", "vfy", "nope/*.bin", home=datacache_home)
    assert r.returncode == 1
    assert r.stderr.decode().strip() == ("error: nope/*.bin: no such file, directory or match in dataset 'vfy' "
                                         "as of its last metadata sync")
    assert "0 blocks (0B) of 0 files checked" in r.stdout.decode()
