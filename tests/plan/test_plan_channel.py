"""Plans (issue 21): checked against the manifest, published through plan files, and the
PyTorch sampler wrapper (DistributedSampler shares)."""

from __future__ import annotations

import json
import os
import random

import pytest
from click.testing import CliRunner

from datacache.cli import cli
from datacache.plan.channel import PlanWatcher, read_plan
from datacache.plan.plan import PlanError
from datacache.stack.plans import publish_plan
from datacache.torch import OrderedPrefetch
from plan_support import make_dataset

N = 24


@pytest.fixture
def planned(datacache_home, tmp_path):
    """``(plane, names)``: datasets ``pics`` (N files) and ``other`` (3 files), synced."""
    make_dataset(datacache_home, tmp_path, "other", [1000] * 3)[0].close()
    plane, files = make_dataset(datacache_home, tmp_path, "pics", [1000 + i for i in range(N)])
    yield plane, sorted(files)
    plane.close()


def test_a_plan_is_published_whole_and_seen_by_a_watcher(planned):
    plane, names = planned
    order = random.Random(1).sample(names, N)
    watcher = PlanWatcher(os.path.join(plane.home, "datasets", "default", "pics"), interval=0)
    assert watcher.poll() == (False, {})
    plan, path = publish_plan(plane.paths, "pics", ["/" + order[0], *order[1:]], epoch=3)
    assert plan.paths == tuple(order) and path.endswith("plans/rank-0.json")
    assert os.stat(path).st_mode & 0o777 == 0o600
    changed, plans = watcher.poll()
    assert changed and plans[0].paths == tuple(order) and plans[0].epoch == 3
    assert watcher.poll() == (False, plans)  # unchanged file: not re-read
    publish_plan(plane.paths, "pics", order[::-1], epoch=4)  # the next epoch replaces it
    changed, plans = watcher.poll()
    assert changed and plans[0].paths == tuple(order[::-1])


def test_bad_plans_are_refused_naming_the_paths(planned):
    plane, names = planned
    with pytest.raises(PlanError) as info:
        publish_plan(plane.paths, "pics", [*names[:3], "train/nope.jpg", "train", names[1]])
    msg = str(info.value)
    assert "2 paths ('train/nope.jpg', 'train') are no file of dataset 'pics'" in msg
    assert "1 path ('train/001.jpg') is given more than once" in msg
    with pytest.raises(PlanError, match=r"1 path \('datacache://other/train/000.jpg'\) is of another dataset"):
        publish_plan(plane.paths, "pics", ["datacache://other/train/000.jpg", "datacache://pics/" + names[0]])
    many = [f"x/{i}" for i in range(8)]
    with pytest.raises(PlanError, match=r"8 paths \('x/0', 'x/1', 'x/2', 'x/3', 'x/4' and 3 more\) are no file"):
        publish_plan(plane.paths, "pics", many)
    assert not os.path.exists(os.path.join(plane.home, "datasets", "default", "pics", "plans", "rank-0.json"))


def test_cli_plan_publishes_and_refuses(planned, tmp_path):
    plane, names = planned
    order = tmp_path / "order.txt"
    order.write_text("\n".join(names[::-1]) + "\n\n")
    run = CliRunner().invoke(cli, ["plan", "pics", "--order", str(order), "--home", plane.home])
    assert run.exit_code == 0, run.output
    assert f"plan of dataset pics (rank 0 of 1): {N} files" in run.output
    plan = read_plan(os.path.join(plane.home, "datasets", "default", "pics", "plans", "rank-0.json"))
    assert plan.paths == tuple(names[::-1])
    order.write_text("train/000.jpg\ntrain/000.jpg\nmissing.jpg\n")
    run = CliRunner().invoke(cli, ["plan", "pics", "--order", str(order), "--home", plane.home])
    assert run.exit_code == 1
    assert run.output.startswith("error: plan for dataset 'pics': 1 path ('missing.jpg') is no file")
    assert "Traceback" not in run.output
    run = CliRunner().invoke(cli, ["plan", "pics", "--clear", "--home", plane.home])
    assert run.exit_code == 0 and "1 withdrawn" in run.output


def test_ordered_prefetch_publishes_each_ranks_share(planned):
    pytest.importorskip("torch.utils.data", reason="needs torch (make venv installs torch 2.13.0, CPU)")
    from torch.utils.data import DistributedSampler

    plane, names = planned
    shares = []
    for rank in range(2):
        sampler = DistributedSampler(range(N), num_replicas=2, rank=rank, shuffle=True, seed=7)
        wrapped = OrderedPrefetch(sampler, dataset="pics", paths=names, home=plane.home)
        wrapped.set_epoch(1)
        indices = list(wrapped)
        assert indices == list(sampler) and len(wrapped) == N // 2
        plan = read_plan(wrapped.published)
        assert (plan.rank, plan.world, plan.epoch) == (rank, 2, 1)
        assert plan.paths == tuple(names[i] for i in indices)  # this rank's share in its order
        shares.append(set(plan.paths))
    assert shares[0].isdisjoint(shares[1]) and shares[0] | shares[1] == set(names)
    with open(os.path.join(plane.home, "datasets", "default", "pics", "plans", "rank-1.json")) as f:
        assert json.load(f)["dataset"] == "pics"
