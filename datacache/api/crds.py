"""CustomResourceDefinitions for Kubernetes, generated from the pydantic models in :mod:`.models`.

One model, two hosts: the embedded control plane validates YAML with the models, and the API server
validates the same documents with the ``openAPIV3Schema`` produced here. Pydantic writes JSON
Schema 2020-12; a CRD needs a *structural* OpenAPI v3.0 schema
(https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#specifying-a-structural-schema),
so :func:`structural` inlines ``$ref``, turns ``X | None`` into ``nullable``, ``Literal`` into
``enum``, numeric ``exclusiveMinimum``/``exclusiveMaximum`` into their boolean 3.0 form, free-form
mappings into ``x-kubernetes-preserve-unknown-fields`` and drops what a structural schema forbids
or what the API server would act on unasked (``default``: defaults stay the models' job, so an
object read back from the cluster equals the one applied).

Printer columns follow Fluid's (UFS TOTAL SIZE, CACHED, CACHE CAPACITY, CACHED PERCENTAGE, PHASE,
AGE). CacheRuntime has the ``scale`` subresource (``spec.replicas`` / ``status.readyWorkers`` /
``status.selector``) so that ``kubectl scale`` and a HorizontalPodAutoscaler can drive it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from .kinds import KINDS
from .models import API_VERSION

__all__ = ["GROUP", "VERSION", "PLURALS", "CLUSTER_SCOPED", "crd", "crds", "structural"]

GROUP, VERSION = API_VERSION.split("/")

PLURALS = {
    "Dataset": "datasets",
    "CacheRuntime": "cacheruntimes",
    "ThinRuntime": "thinruntimes",
    "ThinRuntimeProfile": "thinruntimeprofiles",
    "JuiceFSRuntime": "juicefsruntimes",
    "DataLoad": "dataloads",
    "DataMigrate": "datamigrates",
    "DataProcess": "dataprocesses",
}
"""Kind → plural resource name (``kubectl get datasets``)."""

_SHORT_NAMES = {"Dataset": ["ds"], "CacheRuntime": ["cr"], "DataLoad": ["dl"], "DataMigrate": ["dm"],
                "DataProcess": ["dp"]}
CLUSTER_SCOPED = frozenset({"ThinRuntimeProfile"})
"""Kinds without a namespace."""


def _column(name: str, path: str, kind: str = "string", priority: int = 0) -> dict[str, Any]:
    column = {"name": name, "type": kind, "jsonPath": path}
    if priority:
        column["priority"] = priority  # shown with -o wide only
    return column


_AGE = _column("Age", ".metadata.creationTimestamp", "date")
_RUNTIME_COLUMNS = [
    _column("Desired", ".status.desiredWorkers", "integer"),
    _column("Ready", ".status.readyWorkers", "integer"),
    _column("Cache Capacity", ".status.cacheCapacity"),
    _column("Cached", ".status.cached"),
    _column("Phase", ".status.phase"),
    _AGE,
]
_COLUMNS = {
    "Dataset": [
        _column("Ufs Total Size", ".status.ufsTotal"),
        _column("Cached", ".status.cacheStates.cached"),
        _column("Cache Capacity", ".status.cacheStates.cacheCapacity"),
        _column("Cached Percentage", ".status.cacheStates.cachedPercentage"),
        _column("Phase", ".status.phase"),
        _column("Files", ".status.fileNum", "integer", priority=1),
        _column("Cache Hit Ratio", ".status.cacheStates.cacheHitRatio", priority=1),
        _column("Last Trace Cached", ".status.cacheStates.lastTraceCached", priority=1),
        _AGE,
    ],
    "CacheRuntime": _RUNTIME_COLUMNS,
    "ThinRuntime": _RUNTIME_COLUMNS,
    "JuiceFSRuntime": _RUNTIME_COLUMNS,
    "ThinRuntimeProfile": [_column("File System Type", ".spec.fileSystemType"), _AGE],
    "DataLoad": [
        _column("Dataset", ".spec.dataset.name"),
        _column("Phase", ".status.phase"),
        _column("Duration", ".status.duration"),
        _AGE,
    ],
    "DataMigrate": [
        _column("Policy", ".spec.policy"),
        _column("Phase", ".status.phase"),
        _column("Files", ".status.progress.filesDone", "number"),
        _column("Duration", ".status.duration"),
        _column("Run After", ".spec.runAfter.name", priority=1),
        _AGE,
    ],
    "DataProcess": [
        _column("Dataset", ".spec.dataset.name"),
        _column("Phase", ".status.phase"),
        _column("Exit Code", ".status.exitCode", "integer"),
        _column("Duration", ".status.duration"),
        _column("Run After", ".spec.runAfter.name", priority=1),
        _AGE,
    ],
}

# JSON Schema keys that a CRD schema does not accept or that would change objects server-side.
_DROP = {"title", "default", "additionalProperties", "$defs", "discriminator", "examples"}


def structural(schema: dict[str, Any], defs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Convert one pydantic JSON Schema (2020-12, with ``$defs``) into a structural OpenAPI v3.0
    schema for a CRD. Returns a new dict; ``schema`` is not modified."""
    defs = schema.get("$defs", {}) if defs is None else defs
    if "$ref" in schema:
        target = defs[schema["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        return structural(merged, defs)
    if "anyOf" in schema:
        options = [s for s in schema["anyOf"] if s.get("type") != "null"]
        nullable = len(options) < len(schema["anyOf"])
        rest = {k: v for k, v in schema.items() if k != "anyOf"}
        if schema.get("x-kubernetes-int-or-string"):
            out = {"x-kubernetes-int-or-string": True}
        elif len(options) == 1:
            out = structural({**options[0], **rest}, defs)
        else:  # a union of shapes: let the models' validation decide (admission runs them)
            out = {"x-kubernetes-preserve-unknown-fields": True}
        if "description" in rest:
            out["description"] = rest["description"]
        if nullable:
            out["nullable"] = True
        return out

    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _DROP:
            continue
        if key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            out[key.replace("exclusiveM", "m")] = value
            out[key] = True
        elif key == "properties":
            out[key] = {name: structural(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out[key] = structural(value, defs)
        else:
            out[key] = value
    if "const" in schema and "type" not in out:
        out["type"] = "string"
    if out.get("type") == "object" and "properties" not in out:
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict) and extra.get("type") in ("string", "integer", "number", "boolean"):
            out["additionalProperties"] = {"type": extra["type"]}
        else:  # free-form mapping (options, nodeAffinity, worker details)
            out["x-kubernetes-preserve-unknown-fields"] = True
    if out.get("type") is None and not any(k.startswith("x-kubernetes") for k in out):
        out["x-kubernetes-preserve-unknown-fields"] = True  # Any
    return out


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = structural(model.model_json_schema(by_alias=True, mode="validation"))
    properties = schema["properties"]
    # metadata is the API server's ObjectMeta: a CRD may only say "object" here.
    properties["metadata"] = {"type": "object"}
    properties["apiVersion"] = {"type": "string"}
    properties["kind"] = {"type": "string"}
    schema["required"] = [name for name in schema.get("required", []) if name != "metadata"]
    return schema


def crd(kind: str) -> dict[str, Any]:
    """The ``apiextensions.k8s.io/v1`` CustomResourceDefinition of ``kind`` (a key of ``KINDS``).

    Raises ``KeyError`` for an unknown kind."""
    model = KINDS[kind]
    plural = PLURALS[kind]
    schema = _schema(model)
    version: dict[str, Any] = {
        "name": VERSION,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": schema},
        "additionalPrinterColumns": _COLUMNS[kind],
    }
    if "status" in schema["properties"]:
        version["subresources"] = {"status": {}}
        if kind == "CacheRuntime":
            schema["properties"]["status"]["properties"]["selector"] = {"type": "string"}
            version["subresources"]["scale"] = {
                "specReplicasPath": ".spec.replicas",
                "statusReplicasPath": ".status.readyWorkers",
                "labelSelectorPath": ".status.selector",
            }
    names: dict[str, Any] = {
        "kind": kind,
        "listKind": f"{kind}List",
        "plural": plural,
        "singular": kind.lower(),
        "categories": ["datacache"],
    }
    if kind in _SHORT_NAMES:
        names["shortNames"] = _SHORT_NAMES[kind]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": names,
            "scope": "Cluster" if kind in CLUSTER_SCOPED else "Namespaced",
            "versions": [version],
        },
    }


def crds() -> list[dict[str, Any]]:
    """The CRDs of every kind, in ``KINDS`` order."""
    return [crd(kind) for kind in KINDS]
