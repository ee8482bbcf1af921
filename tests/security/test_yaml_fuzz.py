"""Hostile resource YAML (hypothesis): mutated Dataset / CacheRuntime / DataLoad documents through
the real loader and the real ``datacache apply`` command. Each is accepted, or rejected with a
ConfigError whose every line is located (``SOURCE: field.path: problem``) — never another
exception, never a traceback."""

from __future__ import annotations

import copy
import json

import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from datacache.api.loader import load_resources
from datacache.cli import cli
from datacache.errors import ConfigError

BASE = [
    {"apiVersion": "datacache.io/v1alpha1", "kind": "Dataset", "metadata": {"name": "fuzz", "namespace": "default"},
     "spec": {"mounts": [{"name": "local", "mountPoint": "/nonexistent/fuzz", "path": "/data",
                          "options": {"anon": True},
                          "encryptOptions": [{"name": "key", "valueFrom": {"secretKeyRef": {"name": "s",
                                                                                              "key": "k"}}}]}]}},
    {"apiVersion": "datacache.io/v1alpha1", "kind": "CacheRuntime", "metadata": {"name": "fuzz"},
     "spec": {"replicas": 1, "blockSize": "1Mi",
              "tieredstore": {"levels": [{"mediumtype": "MEM", "quota": "64Mi"},
                                         {"mediumtype": "SSD", "path": "cache/ssd", "quota": "1Gi",
                                          "high": "0.95", "low": "0.8"}]},
              "fuse": {"readAheadBlocks": 4}}},
    {"apiVersion": "datacache.io/v1alpha1", "kind": "DataLoad", "metadata": {"name": "fuzz-load"},
     "spec": {"dataset": {"name": "fuzz", "namespace": "default"}, "target": [{"path": "/data/train"}],
              "policy": "Cron", "schedule": "*/5 * * * *", "loadMetadata": False}},
]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                    st.text(max_size=40),
                    st.sampled_from(["", "..", "../../etc/passwd", "/abs", "a\x00b", "%2e%2e/x", "x" * 300,
                                     "1Ti", "-1Mi", "0", "1e400", "0.5", "NaN", "s3://", "foo://bar",
                                     "Once", "Cron", "MEM", "SSD", "datacache.io/v1alpha1", "${X}"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=12), inner, max_size=3)),
                      max_leaves=8)


def _paths(doc, prefix=()):
    """Every (path) to a value inside ``doc``."""
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, prefix + (i,))


@st.composite
def mutated(draw) -> str:
    docs = copy.deepcopy(draw(st.lists(st.sampled_from(BASE), min_size=1, max_size=3)))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(docs) - 1))
        paths = list(_paths(docs[i]))
        path = draw(st.sampled_from(paths))
        op = draw(st.sampled_from(["replace", "delete", "add"]))
        if not path:
            docs[i] = draw(values)
            continue
        parent = docs[i]
        for step in path[:-1]:
            parent = parent[step]
        if op == "replace":
            parent[path[-1]] = draw(values)
        elif op == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=12))] = draw(values)
    text = "\n---\n".join(yaml.safe_dump(d, allow_unicode=True) if not isinstance(d, str) else json.dumps(d)
                          for d in docs)
    if draw(st.booleans()):  # damage the text itself: YAML syntax errors, tabs, odd bytes
        pos = draw(st.integers(0, len(text)))
        text = text[:pos] + draw(st.sampled_from([":", "- ", "\t", "{", "]", "'", "&a *a", "!!python/object:os.system",
                                                  "\x00", "\ufeff", "---\n", "<<: *x"])) + text[pos:]
    return text


def _assert_located(err: ConfigError, source: str) -> None:
    assert err.problems, "a ConfigError without problems"
    for line in str(err).splitlines():
        assert line.startswith(source), f"unlocated line {line!r}"
    assert "Traceback" not in str(err) and "pydantic" not in str(err).lower()


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(mutated())
def test_loader_accepts_or_locates_every_mutation(text):
    try:
        resources = load_resources("fuzz.yaml", text=text)
    except ConfigError as err:
        _assert_located(err, "fuzz.yaml")
        return
    assert resources and all(r.kind in ("Dataset", "CacheRuntime", "DataLoad") for r in resources)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(mutated())
def test_cli_apply_never_prints_a_traceback(tmp_path_factory, text):
    tmp = tmp_path_factory.mktemp("apply")
    path = tmp / "fuzz.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    result = CliRunner().invoke(cli, ["apply", "-f", str(path), "--home", str(tmp / "home")])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"apply raised {result.exception!r} for:\n{text}") from result.exception
    assert result.exit_code in (0, 1), result.output
    assert "Traceback" not in result.output
    if result.exit_code == 1:
        # the documents applied before a failing one keep their kubectl-style line (README: apply)
        lines = result.output.splitlines()
        assert any(line.startswith("error: ") for line in lines), result.output
        assert lines[0].startswith("error: ") or ".datacache.io/" in lines[0], result.output
