"""The ``runAfter`` graph of data flows: who waits for whom, checked before anything is stored.

Nodes are ``(kind, namespace, name)`` of DataLoads, DataMigrates and DataProcesses; each may
name one predecessor (``spec.runAfter``), so a flow is a chain, or a tree when several wait for
the same one. Plain functions over documents (dicts as stored) and models, shared by the embedded
control plane and the operator.
"""

from __future__ import annotations

from typing import Iterable

from datacache.api.dataflow import FLOW_KINDS

__all__ = ["FLOW_KINDS", "Key", "key_of", "predecessor", "label", "check", "successors", "order", "chains"]
from datacache.errors import ResourceError

Key = tuple[str, str, str]
"""``(kind, namespace, name)``."""


def key_of(doc: dict) -> Key:
    """The node of a stored document."""
    meta = doc["metadata"]
    return doc["kind"], meta.get("namespace", "default"), meta["name"]


def predecessor(doc: dict) -> Key | None:
    """The node ``doc`` waits for (its ``spec.runAfter``), or None."""
    after = (doc.get("spec") or {}).get("runAfter")
    if not after:
        return None
    return after["kind"], after.get("namespace") or doc["metadata"].get("namespace", "default"), after["name"]


def label(key: Key) -> str:
    """``datamigrate default/fetch``: how messages name a node."""
    return f"{key[0].lower()} {key[1]}/{key[2]}"


def check(stored: Iterable[dict], applied: Iterable[dict]) -> None:
    """Refuse a graph with a missing predecessor or a cycle, once ``applied`` documents replace
    the ``stored`` ones of the same key. Raises :class:`ResourceError`, one line naming the
    resource, ``spec.runAfter`` and the fix."""
    graph = {key_of(d): d for d in stored if d["kind"] in FLOW_KINDS}
    new = [d for d in applied if d["kind"] in FLOW_KINDS]
    graph.update({key_of(d): d for d in new})
    for doc in new:
        key, before = key_of(doc), predecessor(doc)
        if before is not None and before not in graph:
            raise ResourceError(f"{label(key)}: spec.runAfter: {label(before)} not found: apply it first "
                                "(or in the same file), or fix spec.runAfter")
        seen = [key]
        while before is not None:
            if before in seen:
                path = " -> ".join(label(k) for k in seen[seen.index(before):] + [before])
                raise ResourceError(f"{label(key)}: spec.runAfter makes a cycle ({path}): a flow must have a "
                                    "first step; remove runAfter from one of them")
            seen.append(before)
            before = predecessor(graph[before]) if before in graph else None


def successors(docs: Iterable[dict], key: Key) -> list[dict]:
    """The documents whose ``runAfter`` names ``key``, by name."""
    return sorted((d for d in docs if predecessor(d) == key), key=lambda d: d["metadata"]["name"])


def order(docs: list[dict]) -> list[dict]:
    """``docs`` with every predecessor before the steps waiting for it, otherwise in the given
    order: a file holding a whole flow runs it from its first step."""
    by_key = {key_of(d): d for d in docs}
    out: list[dict] = []
    done: set[Key] = set()
    for doc in docs:
        path = [doc]  # doc, its predecessor, its predecessor's, ... while in docs and not yet placed
        while (before := predecessor(path[-1])) in by_key and before not in done and by_key[before] not in path:
            path.append(by_key[before])
        for step in reversed(path):
            if key_of(step) not in done:
                done.add(key_of(step))
                out.append(step)
    return out


def chains(docs: Iterable[dict]) -> list[list[dict]]:
    """Every flow as a list of steps from its first one: a step with no predecessor (or one not
    stored) starts a chain; where several wait for one step, each branch is its own chain sharing
    the beginning. Steps alone (no runAfter, nobody waiting) are chains of one."""
    docs = [d for d in docs if d["kind"] in FLOW_KINDS]
    keys = {key_of(d) for d in docs}
    out: list[list[dict]] = []

    def walk(path: list[dict]) -> None:
        nexts = successors(docs, key_of(path[-1]))
        if not nexts:
            out.append(path)
        for nxt in nexts:
            if nxt not in path:
                walk(path + [nxt])

    for doc in sorted(docs, key=lambda d: key_of(d)[1:]):
        if predecessor(doc) not in keys:
            walk([doc])
    return out
