"""The generated CRDs: valid CustomResourceDefinitions, structural, and they accept exactly the
documents the models accept (the examples) and reject what the models reject."""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

import jsonschema
import pytest
import yaml

from datacache.api.crds import crds
from datacache.api.loader import load_resources, to_document

from operator_schemas import validate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _walk(schema, path="$"):
    yield path, schema
    for name, sub in (schema.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _walk(schema["items"], f"{path}[]")


def test_crds_are_valid_and_structural():
    docs = crds()
    assert [d["spec"]["names"]["kind"] for d in docs] == [
        "Dataset", "CacheRuntime", "ThinRuntime", "ThinRuntimeProfile", "JuiceFSRuntime", "DataLoad", "DataMigrate",
        "DataProcess"]
    for doc in docs:
        validate(doc)
        schema = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for path, node in _walk(schema):
            # structural: every node says its type, or is int-or-string / free-form
            assert "type" in node or node.get("x-kubernetes-int-or-string") or node.get(
                "x-kubernetes-preserve-unknown-fields"), f"{doc['metadata']['name']} {path}: no type"
            assert not {"$ref", "anyOf", "default", "title", "const"} & set(node), path


def test_printer_columns_and_scale_subresource():
    by_kind = {d["spec"]["names"]["kind"]: d["spec"] for d in crds()}
    dataset_columns = [c["name"] for c in by_kind["Dataset"]["versions"][0]["additionalPrinterColumns"]]
    assert dataset_columns[:5] == ["Ufs Total Size", "Cached", "Cache Capacity", "Cached Percentage", "Phase"]
    assert dataset_columns[-1] == "Age"
    runtime = by_kind["CacheRuntime"]["versions"][0]
    assert runtime["subresources"] == {"status": {}, "scale": {
        "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.readyWorkers",
        "labelSelectorPath": ".status.selector"}}
    assert "scale" not in by_kind["ThinRuntime"]["versions"][0]["subresources"]
    assert by_kind["ThinRuntimeProfile"]["scope"] == "Cluster"


def test_examples_validate_against_crds():
    files = sorted(glob.glob(os.path.join(ROOT, "examples", "*.yaml")))
    assert files
    checked = 0
    for path in files:
        with open(path, encoding="utf-8") as f:
            for doc in yaml.safe_load_all(f):
                if doc:
                    validate(doc)
                    checked += 1
        # the models' round trip is accepted too (what `datacache get -o yaml` writes); the
        # examples' ${...} placeholders are filled with a path, valid wherever one is used
        with open(path, encoding="utf-8") as f:
            text = re.sub(r"\$\{[A-Z0-9_]+\}", "/placeholder", f.read())
        for resource in load_resources(path, text):
            validate(to_document(resource))
    assert checked >= 4


@pytest.mark.parametrize("spec, field", [
    ({"tieredstore": {"levels": [{"mediumtype": "NVME", "path": "/x", "quota": "1Gi"}]}}, "NVME"),
    ({"tieredstore": {"levels": [{"mediumtype": "SSD", "path": "/x", "quota": "1Gi", "high": 1.5}]}}, "1.5"),
    ({"tieredstore": {"levels": []}, "replicas": -1}, "-1"),
    ({"tieredstore": {"levels": [{"mediumtype": "SSD", "path": "/x", "quota": "1Gi"}]}, "replica": 2}, "replica"),
])
def test_crd_rejects_what_the_models_reject(spec, field):
    doc = {"apiVersion": "datacache.io/v1alpha1", "kind": "CacheRuntime", "metadata": {"name": "x"}, "spec": spec}
    with pytest.raises(jsonschema.ValidationError) as err:
        validate(doc)
    assert field in str(err.value.message)


def test_cli_prints_the_crds():
    out = subprocess.run([sys.executable, "-m", "datacache", "crds"], capture_output=True, text=True, check=True).stdout
    docs = list(yaml.safe_load_all(out))
    assert docs == crds()
