"""Objects from the API server → datacache models.

The API server adds fields a user never writes (``metadata.uid``, ``resourceVersion``,
``managedFields``, ``finalizers``, ...; ``status``): the models forbid unknown fields so that a typo
in a user's YAML is an error, so only what a user writes is validated here.
"""

from __future__ import annotations

from typing import Any, Mapping

from datacache.api.loader import load_resource_dict

_USER_META = ("name", "namespace", "labels", "annotations")


def from_body(body: Mapping[str, Any]) -> Any:
    """The model (``Dataset``, ``CacheRuntime``, ``DataLoad``, ...) of an API object ``body``.

    Raises :class:`datacache.errors.ConfigError` with located one-line messages (``CacheRuntime
    ns/name: spec.tieredstore.levels[0].quota: ...``) when the spec is wrong."""
    meta = body.get("metadata", {})
    doc = {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {key: meta[key] for key in _USER_META if meta.get(key) is not None},
        "spec": body.get("spec"),
    }
    label = f"{body.get('kind')} {meta.get('namespace', '')}/{meta.get('name', '')}".replace(" /", " ")
    return load_resource_dict(doc, label)
