"""Validation of manifests against the Kubernetes schemas (kubernetes-validate, a current release,
strict: unknown fields are errors) and of custom resources against the generated CRDs."""

from __future__ import annotations

from typing import Any

import jsonschema
import kubernetes_validate

from datacache.api.crds import GROUP, crds

K8S_VERSION = kubernetes_validate.utils.latest_version()
"""The newest Kubernetes release whose schemas kubernetes-validate ships (e.g. ``1.37``)."""


def _json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """OpenAPI v3.0 (a CRD's openAPIV3Schema) → JSON Schema, as the API server reads it."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "properties":
            out[key] = {k: _json_schema(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _json_schema(value)
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            bound = schema["minimum" if key == "exclusiveMinimum" else "maximum"]
            out[key] = bound
        elif key.startswith("x-kubernetes") or key == "nullable":
            continue
        else:
            out[key] = value
    if schema.get("exclusiveMinimum"):
        out.pop("minimum", None)
    if schema.get("exclusiveMaximum"):
        out.pop("maximum", None)
    if schema.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    if schema.get("nullable") and "type" in out:
        out["type"] = [*([out["type"]] if isinstance(out["type"], str) else out["type"]), "null"]
    if out.get("type") == "object" and "properties" in out and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("additionalProperties", False)  # the API server prunes: an unknown field is lost
    return out


_CR_SCHEMAS = {c["spec"]["names"]["kind"]: _json_schema(c["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
               for c in crds()}


def validate(obj: dict[str, Any]) -> None:
    """Raise if ``obj`` is not valid: custom resources against the CRDs, everything else against
    the Kubernetes schemas of :data:`K8S_VERSION` (strict)."""
    if obj["apiVersion"].split("/")[0] == GROUP:
        jsonschema.validate(obj, _CR_SCHEMAS[obj["kind"]])
        return
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as err:
        where = "/".join(str(p) for p in err.path)
        raise AssertionError(f"{obj['kind']} {obj['metadata'].get('name')}: {where}: {err.message}") from None
