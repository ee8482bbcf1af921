"""A plan: the order in which a training job will read one dataset's files.

A plan names the dataset, the dataset paths in read order (one epoch, or a window of it) and,
for a distributed job, the epoch and the rank whose share it is. It is checked against the
dataset's manifest before it is published: every path must name a file of that dataset, once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from datacache.errors import DatacacheError
from datacache.manifest import Manifest, normalize

_NAMED = 5  # offending paths named in an error at most


class PlanError(DatacacheError, ValueError):
    """A plan that cannot be used: unknown, repeated or another dataset's paths (at most five
    named, with the count of the rest)."""


@dataclass(frozen=True)
class Plan:
    """``dataset``: its name; ``paths``: dataset paths (normalised, no leading '/') in read order;
    ``epoch``: the epoch it covers (-1: unsaid); ``rank``: whose share (0 for one process);
    ``world``: how many ranks share the epoch."""

    dataset: str
    paths: tuple[str, ...]
    epoch: int = -1
    rank: int = 0
    world: int = 1
    created: float = field(default=0.0, compare=False)  # seconds since the epoch, set when published


def make_plan(dataset: str, paths, manifest: Manifest, epoch: int = -1, rank: int = 0, world: int = 1) -> Plan:
    """A :class:`Plan` of ``paths`` (dataset paths, or ``datacache://DATASET/path`` URLs) checked
    against ``manifest`` (dataset ``dataset``'s). Raises :class:`PlanError` naming up to five
    offending paths per problem: a URL of another dataset, a path that is no file of the
    manifest (missing, a directory, '..'), a path given twice."""
    problems = []
    foreign, unknown, repeated = [], [], []
    seen: set[str] = set()
    clean = []
    for raw in paths:
        path = str(raw)
        if path.startswith("datacache://"):
            owner, _, path = path[len("datacache://"):].partition("/")
            if owner != dataset:
                foreign.append(str(raw))
                continue
        try:
            path = normalize(path)
        except ValueError:
            unknown.append(str(raw))
            continue
        if path in seen:
            repeated.append(path)
            continue
        seen.add(path)
        if manifest.lookup(path) is None:
            unknown.append(path)
            continue
        clean.append(path)
    if foreign:
        problems.append(f"{_listed(foreign)} of another dataset")
    if unknown:
        problems.append(f"{_listed(unknown)} no file of dataset {dataset!r} as of its last sync "
                        f"(run 'datacache sync {dataset}' if they were added since)")
    if repeated:
        problems.append(f"{_listed(repeated)} given more than once (a plan lists each file once)")
    if problems:
        raise PlanError(f"plan for dataset {dataset!r}: " + "; ".join(problems))
    if world < 1 or not 0 <= rank < world:
        raise PlanError(f"plan for dataset {dataset!r}: rank {rank} is not in 0..{world - 1} (world size {world})")
    return Plan(dataset, tuple(clean), epoch, rank, world)


def _listed(paths: list[str]) -> str:
    shown = ", ".join(repr(p) for p in paths[:_NAMED])
    more = f" and {len(paths) - _NAMED} more" if len(paths) > _NAMED else ""
    return f"{len(paths)} path{'s' if len(paths) > 1 else ''} ({shown}{more}) {'are' if len(paths) > 1 else 'is'}"
