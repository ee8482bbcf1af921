"""Loading resources from YAML, with one located line per mistake.

Every mistake in a resource file raises :class:`datacache.errors.ConfigError`, whose message is one
line per problem: ``dataset.yaml: spec.mounts[1].mountPoint: unsupported scheme 'foo' (known: ...)``.
Field paths use the YAML (camelCase) names and ``[index]`` for list items; when a file holds several
documents the line says which, with the resource's kind and name where the document gives them
(``dataset.yaml (document 2, cacheruntime.datacache.io/demo): ...``). Pydantic's errors are translated
here so that a user never sees a traceback-like message or pydantic's help URLs.

A file is checked document by document: the problems of the first wrong document are reported.
"""

from __future__ import annotations

import difflib
import os
import re
import types
import typing
from typing import Any, Union

import yaml
from pydantic import BaseModel, ValidationError

from datacache.errors import ConfigError

from .kinds import KINDS
from .models import API_VERSION, FieldProblems, describe

__all__ = ["load_resources", "load_resource_dict", "to_document", "to_yaml"]


def load_resources(source: str | os.PathLike[str], text: str | None = None) -> list[Any]:
    """Load every resource of a (multi-document) YAML file, in file order.

    ``source`` names the file in messages and is read (UTF-8) when ``text`` is None. Empty
    documents (a trailing ``---``) are skipped. Raises :class:`ConfigError` if the file cannot be
    read, is empty, is not valid YAML, holds a wrong document, or holds the same resource twice.
    """
    label = os.fspath(source)
    if text is None:
        try:
            with open(source, encoding="utf-8") as f:
                text = f.read()
        except OSError as err:
            raise ConfigError(label, [("", f"cannot read the file: {err.strerror or err}")]) from None
        except UnicodeDecodeError:
            raise ConfigError(label, [("", "cannot read the file: it is not UTF-8 text")]) from None
    try:
        documents = list(yaml.load_all(text, Loader=_StrictLoader))
    except yaml.YAMLError as err:
        raise ConfigError(label, [("", _yaml_error_message(err))]) from None

    numbered = [(i, doc) for i, doc in enumerate(documents, start=1) if doc is not None]
    if not numbered:
        raise ConfigError(label, [("", "no resources found: the file is empty")])
    several = len(numbered) > 1
    resources: list[Any] = []
    seen: dict[tuple[str, str, str], int] = {}
    for index, doc in numbered:
        named = _named(doc)
        doc_label = (f"{label} (document {index}, {named})" if named else f"{label} (document {index})") \
            if several else label
        resource = load_resource_dict(doc, doc_label)
        key = (resource.kind, resource.metadata.namespace, resource.metadata.name)
        if key in seen:
            raise ConfigError(doc_label, [("metadata.name", (
                f"{resource.kind} '{key[1]}/{key[2]}' is already defined in document {seen[key]}"
            ))])
        seen[key] = index
        resources.append(resource)
    return resources


def _named(doc: Any) -> str:
    """``cacheruntime.datacache.io/NAME`` for a document that says its kind and name (as ``apply``
    names what it stored, kubectl's form), else ''."""
    if not isinstance(doc, dict) or not isinstance(doc.get("kind"), str):
        return ""
    name = doc.get("metadata", {}).get("name") if isinstance(doc.get("metadata"), dict) else None
    return f"{doc['kind'].lower()}.datacache.io/{name}" if isinstance(name, str) and name else ""


def load_resource_dict(doc: Any, source: str) -> Any:
    """Validate one parsed document and return its model (a ``Dataset``, ``CacheRuntime``, ...).

    ``source`` prefixes every message line. Raises :class:`ConfigError` listing every problem found.
    """
    if not isinstance(doc, dict):
        raise ConfigError(source, [("", (
            f"expected a mapping with apiVersion, kind, metadata and spec, got {describe(doc)}"
        ))])
    problems: list[tuple[str, str]] = []
    if "apiVersion" not in doc:
        problems.append(("apiVersion", f"missing required field: expected '{API_VERSION}'"))
    elif doc["apiVersion"] != API_VERSION:
        problems.append(("apiVersion", f"{describe(doc['apiVersion'])} is not supported: expected '{API_VERSION}'"))
    known = ", ".join(sorted(KINDS))
    kind = doc.get("kind")
    if "kind" not in doc:
        problems.append(("kind", f"missing required field: expected one of {known}"))
    elif not isinstance(kind, str) or kind not in KINDS:
        problems.append(("kind", f"unknown kind {describe(kind)} (known: {known})"
                         + _suggestion(kind, list(KINDS))))
    if not isinstance(kind, str) or kind not in KINDS:
        raise ConfigError(source, problems)

    model = KINDS[kind]
    data = dict(doc, apiVersion=API_VERSION)  # a wrong apiVersion is reported once, above
    try:
        resource = model.model_validate(data)
    except ValidationError as err:
        problems.extend(_translate(err, model))
    if problems:
        raise ConfigError(source, problems)
    return resource


def to_document(resource: BaseModel) -> dict[str, Any]:
    """The resource as a YAML/JSON-ready dict: camelCase names, ``None`` fields left out."""
    return resource.model_dump(mode="json", by_alias=True, exclude_none=True)


def to_yaml(resources: list[BaseModel]) -> str:
    """Resources as one multi-document YAML text, fields in model order; loadable by ``load_resources``."""
    return yaml.safe_dump_all([to_document(r) for r in resources], sort_keys=False)


# --- YAML ---------------------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """A SafeLoader that rejects a key written twice in one mapping (PyYAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                continue
            if key_node.value in first:
                raise yaml.constructor.ConstructorError(
                    None, None,
                    f"duplicate key '{key_node.value}' (first written at line {first[key_node.value]})",
                    key_node.start_mark,
                )
            first[key_node.value] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _yaml_error_message(err: yaml.YAMLError) -> str:
    if isinstance(err, yaml.MarkedYAMLError) and err.problem_mark is not None:
        mark = err.problem_mark
        message = f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {err.problem}"
        if err.context:
            context_line = f" at line {err.context_mark.line + 1}" if err.context_mark else ""
            message += f" ({err.context}{context_line})"
    else:
        message = f"invalid YAML: {err}"
    return " ".join(message.split())


# --- pydantic errors ----------------------------------------------------------------------------

_EXPECTED = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "finite_number": "a finite number",
}

_COMPARISONS = {
    "greater_than": ("gt", "greater than"),
    "greater_than_equal": ("ge", "at least"),
    "less_than": ("lt", "less than"),
    "less_than_equal": ("le", "at most"),
}


def _translate(err: ValidationError, model: type[BaseModel]) -> list[tuple[str, str]]:
    """Turn pydantic's errors into ``(field_path, message)`` pairs, without duplicates.

    A "missing required field" is left out when an unknown field next to it was taken for it
    (``mountpoint`` → "did you mean 'mountPoint'?" says it all).
    """
    errors = err.errors(include_url=False)
    suggested = set()
    for error in errors:
        if error["type"] == "extra_forbidden":
            loc = tuple(error["loc"])
            match = _closest(loc[-1], _field_names(model, loc[:-1]))
            if match:
                suggested.add(loc[:-1] + (match,))
    problems: list[tuple[str, str]] = []
    for error in errors:
        loc = tuple(error["loc"])
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, FieldProblems):
            pairs = [(format_path(loc + tuple(sub)), message) for sub, message in cause.problems]
        elif error["type"] == "missing" and loc in suggested:
            continue
        else:
            pairs = [_message(error, loc, model)]
        for item in pairs:
            if item not in problems:
                problems.append(item)
    return problems


def _message(error: Any, loc: tuple[Any, ...], model: type[BaseModel]) -> tuple[str, str]:
    """One pydantic error as ``(field_path, message)``."""
    path, message = _explain(error, loc, model)
    return format_path(path), message


def _explain(error: Any, loc: tuple[Any, ...], model: type[BaseModel]) -> tuple[tuple[Any, ...], str]:
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    if len(loc) >= 2 and loc[-1] == "[key]":
        return loc[:-2] + (str(loc[-2]),), f"keys must be strings, got {describe(loc[-2])}"
    if kind == "missing":
        return loc, "missing required field"
    if kind == "extra_forbidden":
        name = loc[-1]
        fields = _field_names(model, loc[:-1])
        hint = _suggestion(name, fields)
        if not hint and fields:
            hint = f" (known fields: {', '.join(fields)})"
        return loc, f"unknown field '{name}'{hint}"
    if kind in _EXPECTED:
        return loc, f"expected {_EXPECTED[kind]}, got {describe(value)}"
    if kind in ("literal_error", "enum"):
        return loc, f"expected {ctx.get('expected')}, got {describe(value)}"
    if kind in _COMPARISONS:
        key, words = _COMPARISONS[kind]
        bound = ctx.get(key)
        shown = f"{bound:g}" if isinstance(bound, float) else bound
        return loc, f"must be {words} {shown}, got {describe(value)}"
    if kind == "too_short":
        n = ctx.get("min_length")
        return loc, f"must have at least {n} item{'s' if n != 1 else ''}"
    if kind == "string_too_short":
        return loc, "must not be empty"
    if kind == "string_pattern_mismatch":
        return loc, f"{describe(value)} does not match the pattern {ctx.get('pattern')}"
    if kind in ("value_error", "assertion_error") and ctx.get("error") is not None:
        return loc, str(ctx["error"])
    message = re.sub(r"^(Value|Assertion) error, ", "", error.get("msg", "is not valid"))
    return loc, message


def format_path(loc: tuple[Any, ...]) -> str:
    """``('spec', 'mounts', 1, 'mountPoint')`` → ``spec.mounts[1].mountPoint``; odd keys are quoted."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", str(part)):
            out += f".{part}" if out else str(part)
        else:
            out += f"[{str(part)!r}]"
    return out


def _closest(name: Any, candidates: list[str]) -> str | None:
    """The candidate ``name`` was probably meant as (same letters ignoring case and '_'/'-', else difflib)."""
    if not isinstance(name, str) or not candidates:
        return None
    squashed = {c.lower().replace("_", "").replace("-", ""): c for c in candidates}
    match = squashed.get(name.lower().replace("_", "").replace("-", ""))
    if match is None:
        close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
        match = close[0] if close else None
    return match


def _suggestion(name: Any, candidates: list[str]) -> str:
    match = _closest(name, candidates)
    return f" (did you mean '{match}'?)" if match else ""


def _field_names(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The YAML names of the fields of the model found at ``loc`` below ``model`` ([] if none)."""
    target: Any = model
    for part in loc:
        target = _unwrap(target)
        origin = typing.get_origin(target)
        if isinstance(target, type) and issubclass(target, BaseModel):
            field = next((f for n, f in target.model_fields.items() if part in (n, f.alias)), None)
            if field is None:
                return []
            target = field.annotation
        elif origin in (list, tuple) and isinstance(part, int):
            target = typing.get_args(target)[0]
        elif origin is dict:
            target = typing.get_args(target)[1]
        else:
            return []
    target = _unwrap(target)
    if isinstance(target, type) and issubclass(target, BaseModel):
        return [f.alias or n for n, f in target.model_fields.items()]
    return []


def _unwrap(tp: Any) -> Any:
    """Strip ``Annotated`` and ``Optional`` from a type (the first model of a union wins)."""
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
            tp = models[0] if models else args[0]
        else:
            return tp
