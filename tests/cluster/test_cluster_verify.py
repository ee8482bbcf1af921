"""``datacache verify`` with three cache workers (issue 17 items 4, 5): each worker checks the
copies of the blocks it holds (``POST /v1/verify``), this node's file-tier copy is checked too; a
damaged copy is dropped and named, and the next read refetches exactly what was dropped (counted
by the workers' UFS bytes)."""

from __future__ import annotations

import hashlib
import os

from cluster_support import apply_cluster, wait_for, worker_dirs, worker_metrics, write_files
from datacache.api.quantity import format_bytes
from datacache.cache.blocks import block_count
from datacache.cache.disk import DiskTier
from datacache.stack import layout
from test_cli import dc

NAME = "cv"
BLOCK = 256 << 10
SIZES = {"a.bin": 12 * BLOCK + 5, "b.bin": 3 * BLOCK}


def _ufs_bytes(home) -> float:
    """Bytes the live workers read from the UFS so far."""
    return sum(v for m in worker_metrics(home, NAME).values() for k, v in m.items()
               if k.startswith("datacache_worker_ufs_bytes"))


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_verify_has_each_worker_check_its_copies_and_checks_the_file_tier(cluster_home, tmp_path):
    files = write_files(tmp_path / "src", SIZES)
    plane = apply_cluster(cluster_home, NAME, [{"name": "local", "mountPoint": str(tmp_path / "src")}])
    try:
        dc("warmup", "-q", NAME, home=cluster_home, check=True)
        blocks = sum(block_count(s, BLOCK) for s in SIZES.values())
        r = dc("verify", NAME, home=cluster_home)
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.decode().splitlines() == [
            f"dataset.datacache.io/{NAME} verified: {blocks} blocks ({format_bytes(sum(SIZES.values()))}) of 2 files "
            "checked, 0 blocks failed the checksum, 0B dropped"]

        client = plane.open_dataset(NAME)
        try:
            entry = client.stat("a.bin")
            assert client.local_file(entry) is None  # complete in the workers: copied to the file tier now
            os.close(wait_for(lambda: client.local_file(entry), 30, "a.bin's file-tier copy"))
            key, fid = str(client.source.key(entry, 7)), client.source.key(entry, 0).file_id
        finally:
            client.close()
        copy = os.path.join(layout.file_tier(str(cluster_home), plane.get("CacheRuntime", NAME))[0], fid)
        _flip(copy, 5 * BLOCK + 1)
        damaged = []
        for worker, directory in worker_dirs(cluster_home, NAME).items():
            tier = DiskTier(directory, 1 << 40)
            extent = tier.block_extent(key)
            tier.close()
            if extent is not None:
                _flip(extent[0], extent[1] + 3)
                damaged.append(worker)
        assert len(damaged) == 1, damaged  # one copy of each block (replicas 1)

        r = dc("verify", NAME, home=cluster_home)
        out = r.stdout.decode().splitlines()
        assert r.returncode == 1, out
        assert out == [f"dataset.datacache.io/{NAME} verified: {blocks} blocks ({format_bytes(sum(SIZES.values()))}) "
                       f"of 2 files, 1 file-tier copy checked, 1 block failed the checksum, "
                       f"{format_bytes(BLOCK + SIZES['a.bin'])} dropped",
                       f"  a.bin: block 7 and its file-tier copy failed the checksum: dropped "
                       f"{format_bytes(BLOCK + SIZES['a.bin'])} (the next read fetches it again)"]
        assert not os.path.exists(copy)

        before = _ufs_bytes(cluster_home)
        client = plane.open_dataset(NAME)
        try:
            for path, data in files.items():
                with client.open(path) as f:
                    assert hashlib.sha256(f.read()).digest() == hashlib.sha256(data).digest(), path
        finally:
            client.close()
        assert _ufs_bytes(cluster_home) - before == BLOCK  # only the dropped block was fetched again
    finally:
        plane.close()
