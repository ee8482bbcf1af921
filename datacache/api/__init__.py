"""Resource models and YAML loading for ``apiVersion: datacache.io/v1alpha1``.

``load_resources("dataset.yaml")`` returns the validated resources of a file or raises
:class:`datacache.errors.ConfigError` with one located line per mistake; ``to_document`` turns a
resource back into a YAML-ready dict. Sizes are parsed by :func:`parse_quantity`.
"""

import importlib

# Names are imported from their module on first use (PEP 562): the ``datacache`` command imports
# ``datacache.api.quantity`` for every call, and pydantic's models cost a tenth of a second.
_SOURCE = {
    **dict.fromkeys(("load_resource_dict", "load_resources", "to_document", "to_yaml"), "loader"),
    **dict.fromkeys(("format_bytes", "parse_quantity"), "quantity"),
    **dict.fromkeys(("KINDS", "Resource"), "kinds"),
    **dict.fromkeys(("DataMigrate", "DataProcess", "ExternalStorage", "MigrateEndpoint", "DatasetPath"), "dataflow"),
}


__all__ = [
    "API_VERSION",
    "KINDS",
    "CacheRuntime",
    "CacheRuntimeSpec",
    "CacheStates",
    "Condition",
    "DataLoad",
    "DataLoadDataset",
    "DataLoadSpec",
    "DataLoadStatus",
    "DataLoadTarget",
    "DataMigrate",
    "DataProcess",
    "DatasetPath",
    "ExternalStorage",
    "MigrateEndpoint",
    "RunAfter",
    "Dataset",
    "DatasetSpec",
    "DatasetStatus",
    "EncryptOption",
    "EncryptOptionSource",
    "FuseSpec",
    "Level",
    "Mount",
    "ObjectMeta",
    "Resource",
    "RuntimeStatus",
    "SecretKeySelector",
    "TargetStatus",
    "TieredStore",
    "WorkerSpec",
    "format_bytes",
    "known_schemes",
    "load_resource_dict",
    "load_resources",
    "parse_quantity",
    "register_scheme",
    "to_document",
    "to_yaml",
]


def __getattr__(name: str):
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_SOURCE.get(name, 'models')}", __name__), name)


def __dir__() -> list[str]:
    return sorted(__all__)
