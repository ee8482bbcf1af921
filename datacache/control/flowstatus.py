"""Status documents of flow steps (DataMigrate, DataProcess, and a DataLoad waiting on runAfter),
as the embedded host writes them: one shape for every kind, so chains read the same."""

from __future__ import annotations

import os
import time

from datacache.state import now_iso

FINISHED = ("Complete", "Failed", "Cancelled")


def executing(started: str) -> dict:
    """The status of a step running in this process since ``started`` (``runnerPid``: who runs it)."""
    return {"phase": "Executing", "lastScheduleTime": started, "runnerPid": os.getpid()}


def running_elsewhere(status: dict | None) -> int | None:
    """The pid of another live process running the step, if its status says Executing; None
    when nobody does (a run left Executing by a killed process can be run again)."""
    status = status or {}
    pid = status.get("runnerPid")
    if status.get("phase") != "Executing" or not isinstance(pid, int) or pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # alive, another user's
        return pid
    return pid


def finished(phase: str, started: str, t0: float, reason: str = "", message: str = "", **fields) -> dict:
    """A finished step's status: ``phase``, ``duration`` since ``t0`` (monotonic seconds),
    ``lastScheduleTime`` ``started``, ``completionTime`` now, and a ``Complete`` condition (True,
    or False with ``reason``/``message``); ``fields`` are added (camelCase)."""
    ok = phase == "Complete"
    condition = {"type": "Complete", "status": "True" if ok else "False", "reason": reason or phase,
                 "message": message, "lastTransitionTime": now_iso()}
    status = {"phase": phase, "duration": f"{time.monotonic() - t0:.1f}s", "lastScheduleTime": started,
              "completionTime": now_iso(), "conditions": [condition], **fields}
    if ok:
        status["lastSuccessfulTime"] = status["completionTime"]
    return status


def waiting(before: str) -> dict:
    """The status of a step waiting for its predecessor (``before``: how messages name it)."""
    return {"phase": "Pending", "conditions": [{
        "type": "Complete", "status": "False", "reason": "WaitingForPredecessor",
        "message": f"runAfter: waits for {before} to complete", "lastTransitionTime": now_iso()}]}


def predecessor_failed(before: str, why: str) -> dict:
    """The status of a step that will not run because ``before`` failed (``why``: its reason)."""
    return {"phase": "Failed", "completionTime": now_iso(), "conditions": [{
        "type": "Complete", "status": "False", "reason": "PredecessorFailed",
        "message": f"runAfter: {before} failed: {why}", "lastTransitionTime": now_iso()}]}


def reason_of(status: dict | None) -> str:
    """Why a step failed (its Complete condition's message), '' when it did not."""
    for condition in (status or {}).get("conditions") or []:
        if condition.get("type") == "Complete" and condition.get("status") == "False":
            return condition.get("message") or condition.get("reason") or ""
    return ""
