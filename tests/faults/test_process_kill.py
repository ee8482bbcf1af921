"""kill -9 of a warmup (24 rounds) and of a FUSE daemon (20) at random moments (workers: see
test_worker_kill.py): afterwards
every stored block verifies and equals the source, blocks cached before a kill are kept, the state
database and the manifest are intact, and a final run completes with every file right (sha256)."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import sys
import time

import pytest

from datacache.cache.disk import FILES, ORPHAN_GRACE_S, DiskTier
from datacache.cluster.store import ServingDiskTier
from datacache.control.embedded import Embedded
from fault_support import apply_dataset, read_all, sha

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fuse"))
from fuse_support import HAVE_FUSE, SKIP_REASON, daemon_pid, force_cleanup, is_listed, mount  # noqa: E402

BLOCK = 64 << 10
ROUNDS = 24
# Each round mounts afresh (a daemon start: ~1-3 s, ~2.9 s a round in all). 12 rounds (was 20):
# every round checks the dead mount answers ENOTCONN and is replaced (case C11), and 12 random
# kill moments over 0.1-0.8 s of reads still spread over the reads of the first files.
FUSE_ROUNDS = 12


@pytest.fixture
def crash_ds(datacache_home, tmp_path):
    """Dataset ``crash``: 32 local files of 1 MiB (16 blocks each) on an SSD tier."""
    src = tmp_path / "src"
    src.mkdir()
    rng = random.Random(5)
    files = {f"d{i % 4}/f{i:02d}.bin": rng.randbytes(1 << 20) for i in range(32)}
    for name, data in files.items():
        (src / name).parent.mkdir(exist_ok=True)
        (src / name).write_bytes(data)
    plane = apply_dataset(datacache_home, "crash", [{"name": "local", "mountPoint": str(src)}],
                          [{"mediumtype": "SSD", "path": "cache", "quota": "1Gi"}], block_size="64Ki")
    plane.sync("crash")
    plane.close()
    return str(datacache_home), files, os.path.join(str(datacache_home), "cache", "default", "crash")


def _warm(home: str) -> None:  # in a forked child, killed at a random moment
    Embedded(home).warmup("crash", ["/"])
    os._exit(0)


def _verify_store(client, files: dict[str, bytes]) -> int:
    """Every stored block of every file verifies and equals the source bytes; returns the count."""
    disk = next(lv for lv in client.source.store.levels if isinstance(lv, DiskTier))
    stored = 0
    for name, data in files.items():
        entry = client.stat(name)
        for i in range(len(data) // BLOCK):
            key = str(client.source.key(entry, i))
            if key in disk:
                got = disk.get(key)
                assert got is not None and bytes(got) == data[i * BLOCK:(i + 1) * BLOCK], f"{name} block {i}"
                stored += 1
    assert disk.corrupt == 0, "a half-written block was indexed"
    return stored


def test_warmup_killed_at_random_moments(crash_ds):
    home, files, level_dir = crash_ds
    rng = random.Random(11)
    ctx = multiprocessing.get_context("fork")
    kept_total = 0
    t0 = time.monotonic()
    for rnd in range(ROUNDS):
        tier = ServingDiskTier(level_dir, 1 << 30)  # churn: drop a random half so each warmup has work
        keys = sorted(tier.keys())
        before = set(rng.sample(keys, len(keys) // 2)) if keys else set()
        for key in before:
            tier.discard(key)
        survivors = set(keys) - before
        tier.close()
        child = ctx.Process(target=_warm, args=(home,))
        child.start()
        time.sleep(rng.uniform(0.05, 1.2))
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
        assert child.exitcode is not None, "warmup child did not die"
        tier = DiskTier(level_dir, 1 << 30)
        now = set(tier.keys())
        tier.close()
        assert survivors <= now, f"round {rnd}: blocks cached before the kill were lost"
        kept_total += len(now)
    # Files of killed writes (a new file is written before its index row) are swept at the next
    # start once older than the grace period: after it, one cache file per indexed file version.
    old = time.time() - ORPHAN_GRACE_S - 1
    for root, _, names in os.walk(level_dir):
        for n in names:
            os.utime(os.path.join(root, n), (old, old))
    tier = DiskTier(level_dir, 1 << 30)
    tier.sweeper.join(30)
    cache_files = len(os.listdir(os.path.join(level_dir, FILES)))
    versions = {key.rsplit("/", 1)[0] for key in tier.keys()}
    assert cache_files == len(versions), f"{cache_files} cache files, {len(versions)} file versions indexed"
    orphans = tier.orphans_removed
    tier.close()
    plane = Embedded(home)
    try:
        client = plane.open_dataset("crash")
        try:
            stored = _verify_store(client, files)
            assert stored > 0
            for name, data in files.items():  # reads are right with a partial cache
                assert sha(read_all(client, name)) == sha(data)
        finally:
            client.close()
        # State intact: resources readable, manifest whole, a fresh warmup completes.
        assert plane.get("Dataset", "crash").metadata.name == "crash"
        assert plane.load_manifest(plane.get("Dataset", "crash")).file_num == len(files)
        _, result = plane.warmup("crash", ["/"])
        assert result.ok
        client = plane.open_dataset("crash")
        try:
            assert _verify_store(client, files) == sum(len(d) // BLOCK for d in files.values())
        finally:
            client.close()
    finally:
        plane.close()
    print(f"\n{ROUNDS} warmups killed in {time.monotonic() - t0:.1f} s, {kept_total} block-rounds kept, "
          f"{orphans} orphan block files swept")


@pytest.mark.skipif(not HAVE_FUSE, reason=SKIP_REASON)
def test_fuse_daemon_killed_during_reads(crash_ds, tmp_path):
    home, files, _ = crash_ds
    rng = random.Random(3)
    mp = str(tmp_path / "mnt")
    os.makedirs(mp)
    names = sorted(files)

    class Env:
        name = "crash"

    Env.home = home
    try:
        for rnd in range(FUSE_ROUNDS):
            printed = mount(Env, mp)  # over the dead mount of the previous round: replaced (case C11)
            pid = daemon_pid(home, mp)  # known as soon as the mount answers
            assert pid == printed
            deadline = time.monotonic() + rng.uniform(0.1, 0.8)
            killed = False
            for name in rng.sample(names, len(names)):
                if time.monotonic() > deadline and not killed:
                    os.kill(pid, signal.SIGKILL)
                    killed = True
                try:
                    with open(os.path.join(mp, name), "rb") as f:
                        data = f.read()
                except OSError as err:
                    assert killed, f"round {rnd}: {err!r} before the kill"
                    break
                assert sha(data) == sha(files[name]), f"round {rnd}: wrong bytes for {name}"
            if not killed:
                os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
            with pytest.raises(OSError):  # ENOTCONN, never a hang (case C11)
                os.listdir(mp)
        mount(Env, mp)
        assert is_listed(mp)
        for name in names:
            with open(os.path.join(mp, name), "rb") as f:
                assert sha(f.read()) == sha(files[name])
    finally:
        force_cleanup(home, mp)
