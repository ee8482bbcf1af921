"""Data flows on the embedded host: DataMigrate, DataProcess and DataLoad steps chained by
``runAfter`` (as Fluid's DataFlow).

A step with policy Once runs when applied if it waits for nothing, or once its predecessor is
Complete (at once when that already is); while the predecessor is Pending or Executing the step
is Pending (reason ``WaitingForPredecessor``); when the predecessor fails, the step and every
step after it are marked Failed with reason ``PredecessorFailed`` and the predecessor's reason.
Applying again a step that did not complete (failed, or left Executing by a killed process) runs
it again: a DataMigrate then resumes, skipping the files already copied. Cron steps are fired by
``datacache controller`` (:mod:`.controller`), and their successors follow each run.

:func:`flow_rows` and :func:`where_stopped` give the CLI its view of the chains
(``datacache get dataflows``, ``datacache describe``).
"""

from __future__ import annotations

import logging
import threading

from datacache.api.loader import load_resource_dict, to_document
from datacache.control import flowgraph, flowstatus
from datacache.control.migraterun import run_migrate
from datacache.control.processrun import run_process
from datacache.errors import DatacacheError, describe_error

log = logging.getLogger("datacache.flows")


def is_step(res) -> bool:
    """Whether this module runs ``res`` (a model): a DataMigrate, a DataProcess, or a DataLoad
    waiting for another step."""
    return res.kind in ("DataMigrate", "DataProcess") or (res.kind == "DataLoad" and res.spec.run_after is not None)


def _key(res) -> flowgraph.Key:
    return res.kind, res.metadata.namespace, res.metadata.name


def _model(doc: dict):
    meta = doc["metadata"]
    return load_resource_dict(doc, f"state:{doc['kind']}/{meta['namespace']}/{meta['name']}")


def run_step(plane, res, cancel: threading.Event | None = None) -> tuple[bool, str]:
    """Run one step now; ``(ok, reason)``, never raises for the step's own failure."""
    if res.kind == "DataMigrate":
        return run_migrate(plane, res, cancel)
    if res.kind == "DataProcess":
        return run_process(plane, res, cancel)
    try:
        result = plane.run_dataload(res, cancel=cancel)
    except (DatacacheError, OSError) as err:  # the DataLoad's status already says Failed, and why
        return False, describe_error(err)
    failures = [f for t in result.targets for f in t.failures]
    return result.ok, "loaded" if result.ok else ("; ".join(failures[:3]) or "not every target is cached")


def run_and_follow(plane, res, cancel: threading.Event | None = None) -> tuple[bool, str]:
    """Run ``res``, then the Once steps waiting for it (recursively); returns ``res``'s own result."""
    ok, reason = run_step(plane, res, cancel)
    follow(plane, _key(res), ok, reason, cancel)
    return ok, reason


def follow(plane, key: flowgraph.Key, ok: bool, reason: str, cancel: threading.Event | None = None) -> None:
    """After step ``key`` finished: run the Once steps waiting for it when it completed, else mark
    them and every step after them Failed with ``reason``."""
    docs = [d for kind in ("DataLoad", "DataMigrate", "DataProcess") for d in plane.state.list(kind, key[1])]
    for doc in flowgraph.successors(docs, key):
        step = _model(doc)
        if getattr(step.spec, "policy", "Once") != "Once":
            continue
        if ok:
            log.info("%s: %s completed, running it", flowgraph.label(_key(step)), flowgraph.label(key))
            run_and_follow(plane, step, cancel)
        else:
            _fail_after(plane, step, flowgraph.label(key), reason)


def _fail_after(plane, step, before: str, why: str) -> None:
    meta = step.metadata
    plane.state.set_status(step.kind, meta.name, meta.namespace, flowstatus.predecessor_failed(before, why))
    follow(plane, _key(step), False, f"runAfter: {before} failed: {why}")


def on_apply(plane, res, verb: str) -> None:
    """What applying step ``res`` (stored as ``verb``) does: see the module docstring. Raises
    :class:`DatacacheError` when the step ran and failed, or its predecessor had failed."""
    meta = res.metadata
    status = (plane.state.get(res.kind, meta.name, meta.namespace) or {}).get("status") or {}
    if getattr(res.spec, "policy", "Once") != "Once":  # Cron (and OnEvent DataLoads): the controller fires them
        if verb == "created":
            plane.state.set_status(res.kind, meta.name, meta.namespace, {"phase": "Pending"})
        return
    if verb == "unchanged" and status.get("phase") == "Complete":
        return
    runner = flowstatus.running_elsewhere(status)
    if runner is not None:  # never two copies of one step at once; its end runs what follows
        raise DatacacheError(f"it is running now (process {runner}): apply it again once it has finished")
    before = flowgraph.predecessor(to_document(res))
    if before is not None:
        parent = plane.state.get(before[0], before[2], before[1]) or {}
        phase = (parent.get("status") or {}).get("phase", "Pending")
        if phase in ("Failed", "Cancelled"):
            why = flowstatus.reason_of(parent.get("status")) or phase
            _fail_after(plane, res, flowgraph.label(before), why)
            raise DatacacheError(f"runAfter: {flowgraph.label(before)} failed: {why}")
        if phase != "Complete":
            plane.state.set_status(res.kind, meta.name, meta.namespace, flowstatus.waiting(flowgraph.label(before)))
            return
    ok, reason = run_and_follow(plane, res)
    if not ok:
        raise DatacacheError(f"its run failed: {reason}")


# -- views ---------------------------------------------------------------------------------------

def _phase(doc: dict) -> str:
    return (doc.get("status") or {}).get("phase") or "Pending"


def where_stopped(chain: list[dict]) -> tuple[str, str, str]:
    """``(phase, step, reason)`` of a chain: Complete when every step is; else the first step not
    Complete (``kind/name``), its phase and why (Failed: its reason; Pending: what it waits for)."""
    for doc in chain:
        phase = _phase(doc)
        if phase != "Complete":
            step = f"{doc['kind'].lower()}/{doc['metadata']['name']}"
            return phase, step, flowstatus.reason_of(doc.get("status"))
    return "Complete", "", ""


def flow_rows(plane, namespace: str | None) -> list[list[str]]:
    """Rows of ``datacache get dataflows``: FLOW (its first step), STEPS (``kind/name:phase``
    joined by ``->``), PHASE, STOPPED AT, REASON."""
    docs = [d for kind in ("DataLoad", "DataMigrate", "DataProcess") for d in plane.state.list(kind, namespace)]
    rows = []
    for chain in flowgraph.chains(docs):
        if len(chain) == 1 and flowgraph.predecessor(chain[0]) is None and chain[0]["kind"] == "DataLoad":
            continue  # a plain DataLoad is no flow: 'get dataloads' shows it
        phase, step, reason = where_stopped(chain)
        steps = " -> ".join(f"{d['kind'].lower()}/{d['metadata']['name']}:{_phase(d)}" for d in chain)
        rows.append([chain[0]["metadata"]["name"], steps, phase, step, reason])
    return rows


def flow_of(plane, kind: str, name: str, namespace: str) -> dict | None:
    """For ``datacache describe``: the chain holding step ``kind/name`` as ``{steps: [...],
    phase, stoppedAt, reason}`` (None when it is in no flow)."""
    docs = [d for k in ("DataLoad", "DataMigrate", "DataProcess") for d in plane.state.list(k, namespace)]
    for chain in flowgraph.chains(docs):
        if len(chain) < 2 or not any(flowgraph.key_of(d) == (kind, namespace, name) for d in chain):
            continue
        phase, step, reason = where_stopped(chain)
        out = {"steps": [f"{d['kind'].lower()}/{d['metadata']['name']}: {_phase(d)}" for d in chain], "phase": phase}
        if step:
            out["stoppedAt"] = step
        if reason:
            out["reason"] = reason
        return out
    return None
