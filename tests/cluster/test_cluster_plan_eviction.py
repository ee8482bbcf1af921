"""Cache workers evict by the node's training-order plans (issue 21): a worker reads the plans
and the positions the node's readers report from the dataset's directory, and its disk tier
evicts first the blocks no plan needs, then those already read, then those needed furthest ahead.
Checked on real worker processes against what their cache directories hold; the same warmups on a
runtime without a plan keep what LRU keeps."""

from __future__ import annotations

import random

from cluster_support import apply_cluster, block_bytes, stored_keys, write_files
from datacache.cluster.placement import owners
from datacache.plan.channel import read_plan, share_position
from datacache.stack import layout
from datacache.stack.plans import publish_plan

BLOCK = 256 << 10
WORKERS = ["worker-0", "worker-1"]
# A worker's tier: 16 blocks of 256 KiB, the index and its WAL (up to ~1.2 MB) included; an
# eviction goes down to 70 % of it.
LEVELS = [{"mediumtype": "SSD", "path": "cache", "quota": "4Mi"}]


def _runtime(home, tmp_path, name: str):
    """Two workers over 64 files a/.. (the plan's candidates) and 24 others n/.. (256 KiB each,
    one block); returns ``(plane, block key of each path)``."""
    sizes = {f"a/{i:02d}.bin": BLOCK for i in range(64)} | {f"n/{i:02d}.bin": BLOCK for i in range(24)}
    write_files(tmp_path / name, sizes)
    plane = apply_cluster(home, name, [{"name": "local", "mountPoint": str(tmp_path / name)}], LEVELS, replicas=2,
                          block_size="256Ki")
    manifest = plane.load_manifest(plane.get("Dataset", name))
    keys = {e.path.lstrip("/"): key for e in manifest for key in block_bytes([e], BLOCK, name)}
    return plane, keys


def _kept(home, name: str, keys: dict[str, str], paths: list[str]) -> dict[str, list[str]]:
    """Per worker, which of ``paths`` (in their order) its disk holds."""
    held = stored_keys(home, name)
    return {w: [p for p in paths if keys[p] in held.get(w, set())] for w in WORKERS}


def _plan(keys: dict[str, str]) -> list[str]:
    """The plan: 12 a/.. files owned by each worker, in a fixed shuffled order (placement hashes
    keys that differ from run to run, so the files are picked by owner rather than by name)."""
    by_owner = {w: [p for p in sorted(keys) if p.startswith("a/") and owners(keys[p], WORKERS)[0] == w][:12]
                for w in WORKERS}
    assert all(len(share) == 12 for share in by_owner.values()), by_owner  # 64 candidates: ~1e-6 to miss
    planned = by_owner["worker-0"] + by_owner["worker-1"]
    random.Random(7).shuffle(planned)
    return planned


def test_workers_keep_the_blocks_the_plan_needs_soonest(cluster_home, tmp_path):
    others = [f"n/{i:02d}.bin" for i in range(24)]
    kept_after_others = {}
    for name, plan in (("pl", True), ("lr", False)):
        plane, keys = _runtime(cluster_home, tmp_path, name)
        try:
            planned = _plan(keys)
            mine = {w: [p for p in planned if owners(keys[p], WORKERS)[0] == w] for w in WORKERS}  # in plan order
            if plan:
                published = read_plan(publish_plan(plane.paths, name, planned)[1])  # as readers see it
            plane.warmup(name, planned)  # some are evicted (the result says so): the quota is smaller
            plane.warmup(name, others)  # files no plan needs
            kept = kept_after_others[name] = _kept(cluster_home, name, keys, planned)
            if not plan:
                continue
            for w in WORKERS:  # the worker's planned files needed soonest stay, those needed last went
                assert kept[w] and kept[w] == mine[w][:len(kept[w])], (w, kept[w], mine[w])
            # The readers have read the plan's first 6 files (as a reading process reports it); the
            # files ahead are loaded again, then the others: files read go before files ahead.
            share_position(layout.dataset_dir(plane.home, "default", name), published, 5)
            plane.warmup(name, planned[6:])
            plane.warmup(name, others)
            after = _kept(cluster_home, name, keys, planned)
            behind_gone = 0
            for w in WORKERS:
                ahead = [p for p in mine[w] if planned.index(p) > 5]
                kept_ahead = [p for p in after[w] if p in ahead]
                kept_behind = [p for p in after[w] if p not in ahead]
                assert kept_ahead and kept_ahead == ahead[:len(kept_ahead)], (w, after[w], ahead)
                assert not kept_behind or kept_ahead == ahead, (w, after[w], ahead)  # read before ahead
                behind_gone += len(mine[w]) - len(ahead) - len(kept_behind)
            assert behind_gone, after  # the files read were evicted (before any the plan still needs)
        finally:
            plane.close()
    with_plan, lru = (sum(map(len, kept_after_others[n].values())) for n in ("pl", "lr"))
    assert lru < with_plan, kept_after_others  # LRU let the newer unplanned files push the planned ones out

