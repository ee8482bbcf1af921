"""Autoscale decisions as a table: policy + worker metrics + times → replicas, reason, victims."""

from __future__ import annotations

import pytest

from datacache.api.models import AutoscalePolicy, CacheRuntimeSpec
from datacache.errors import ConfigError
from datacache.api.loader import load_resources
from datacache.control.autoscale import WorkerMetrics, decide, low_since, used_ratio

GiB = 1024**3


def W(name: str, used_gib: float, hot: int = 0, cap_gib: float = 10) -> WorkerMetrics:
    return WorkerMetrics(name, int(cap_gib * GiB), int(used_gib * GiB), hot)


P = AutoscalePolicy(min_replicas=1, max_replicas=4, target_used_ratio=0.8, scale_up_step=2, cooldown=60)
G = P.model_copy(update={"scale_down": "Gated"})

TABLE = [
    # id, policy, current, workers, now, last_scale, below_since, replicas, remove, reason part
    ("under-target-holds", P, 2, [W("a", 5), W("b", 5)], 1000, None, None, 2, (), "capacity used 50%"),
    ("over-target-scales-by-step", P, 1, [W("a", 9)], 1000, None, None, 3, (), "from 1 to 3"),
    ("step-capped-at-max", P, 3, [W("a", 9), W("b", 9), W("c", 9)], 1000, None, None, 4, (), "from 3 to 4"),
    ("at-max-holds", P, 4, [W(n, 9) for n in "abcd"], 1000, None, None, 4, (), "already at maxReplicas 4"),
    ("exactly-at-target-holds", P, 1, [W("a", 8)], 1000, None, None, 1, (), "capacity used 80%"),
    ("cooldown-holds", P, 1, [W("a", 9.5)], 1000, 970, None, 1, (), "cooling down for 30s"),
    ("cooldown-over-scales", P, 1, [W("a", 9.5)], 1000, 940, None, 3, (), "from 1 to 3"),
    ("below-min-raises-now", P.model_copy(update={"min_replicas": 2}), 1, [W("a", 0)], 1000, 999, None, 2, (),
     "below minReplicas 2"),
    ("above-max-removes-coldest", P, 6, [W("a", 1, 50), W("b", 1, 5), W("c", 1, 9), W("d", 1, 70),
                                         W("e", 1, 60), W("f", 1, 80)], 1000, 999, None, 4, ("b", "c"),
     "above maxReplicas 4"),
    ("no-metrics-holds", P, 2, [], 1000, None, None, 2, (), "no ready worker"),
    ("disabled-never-scales-in", P, 3, [W(n, 0) for n in "abc"], 1000, None, 0, 3, (), "capacity used 0%"),
    ("gated-scales-in-coldest", G, 3, [W("a", 1, 30), W("b", 1, 10), W("c", 1, 20)], 1000, None, 900, 2,
     ("b",), "from 3 to 2"),
    ("gated-not-long-enough", G, 3, [W(n, 1) for n in "abc"], 1000, None, 950, 3, (), "for 60s"),
    ("gated-unknown-history", G, 3, [W(n, 1) for n in "abc"], 1000, None, None, 3, (), "for 60s"),
    ("gated-within-margin", G, 2, [W("a", 6.5), W("b", 6.5)], 1000, None, 0, 2, (), "needs below 60%"),
    ("gated-remaining-too-full", G, 2, [W("a", 5.9), W("b", 5.9)], 1000, None, 0, 2, (), "could not hold"),
    ("gated-not-below-min", G, 1, [W("a", 0)], 1000, None, 0, 1, (), "capacity used 0%"),
]


@pytest.mark.parametrize("case", TABLE, ids=[row[0] for row in TABLE])
def test_decision_table(case):
    _, policy, current, workers, now, last, below, replicas, remove, reason = case
    got = decide(policy, current, workers, now, last, below_since=below)
    assert (got.replicas, got.remove) == (replicas, remove)
    assert reason in got.reason and "\n" not in got.reason


def test_low_since_tracks_a_continuous_low_period():
    low, high = [W("a", 1)], [W("a", 7)]
    assert low_since(G, low, 10, None) == 10
    assert low_since(G, low, 20, 10) == 10  # still low: the start is kept
    assert low_since(G, high, 30, 10) is None  # 70% is not below 80% - 20%
    assert used_ratio([W("a", 2), W("b", 6)]) == pytest.approx(0.4)
    assert used_ratio([]) == 0.0


@pytest.mark.parametrize("fields, line", [
    ("minReplicas: 3\n    maxReplicas: 2",
     "spec.autoscale.maxReplicas: maxReplicas 2 is below minReplicas 3: raise maxReplicas or lower minReplicas"),
    ("maxReplicas: 2\n    targetUsedRatio: 0", "spec.autoscale.targetUsedRatio:"),
    ("maxReplicas: 2\n    targetUsedRatio: 1.5", "spec.autoscale.targetUsedRatio:"),
    ("maxReplicas: 2\n    scaleUpStep: 0", "spec.autoscale.scaleUpStep:"),
    ("maxReplicas: 2\n    scaleDown: Always", "spec.autoscale.scaleDown:"),
    ("maxReplicas: 2\n    cooldown: -1", "spec.autoscale.cooldown:"),
    ("maxReplicas: 2\n    scaleDown: Gated\n    targetUsedRatio: 0.1",
     "spec.autoscale.scaleDownMargin: scaleDownMargin 0.2 must be below targetUsedRatio 0.1"),
])
def test_policy_errors_are_located(fields, line):
    text = f"""apiVersion: datacache.io/v1alpha1
kind: CacheRuntime
metadata: {{name: demo}}
spec:
  tieredstore: {{levels: [{{mediumtype: MEM, quota: 1Gi}}]}}
  autoscale:
    {fields}
"""
    with pytest.raises(ConfigError) as info:
        load_resources("runtime.yaml", text)
    message = str(info.value)
    assert f"runtime.yaml: {line}" in message and "Traceback" not in message


def test_policy_on_cache_runtime_spec_from_yaml_names():
    spec = CacheRuntimeSpec.model_validate({
        "tieredstore": {"levels": [{"mediumtype": "MEM", "quota": "1Gi"}]},
        "autoscale": {"minReplicas": 1, "maxReplicas": 5, "targetUsedRatio": 0.7, "scaleDown": "Gated"},
    })
    assert spec.autoscale is not None
    assert (spec.autoscale.max_replicas, spec.autoscale.target_used_ratio) == (5, 0.7)
    assert spec.autoscale.scale_down == "Gated" and spec.autoscale.cooldown == 300.0


def test_autoscale_on_a_thin_runtime_is_refused():
    text = """apiVersion: datacache.io/v1alpha1
kind: ThinRuntime
metadata: {name: thin}
spec:
  profileName: p
  tieredstore: {levels: [{mediumtype: MEM, quota: 1Gi}]}
  autoscale: {maxReplicas: 2}
"""
    with pytest.raises(ConfigError) as info:
        load_resources("thin.yaml", text)
    assert str(info.value) == ("thin.yaml: spec.autoscale: a ThinRuntime's cache runs in the reading process "
                               "(replicas 0 or 1): autoscale is only for CacheRuntimes; remove it")
