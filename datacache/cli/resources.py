"""Resource verbs: apply, get, describe, delete."""

from __future__ import annotations

import contextlib
import json
import logging
import sys

import click

KIND_NAMES = {
    "dataset": "Dataset", "datasets": "Dataset", "ds": "Dataset",
    "cacheruntime": "CacheRuntime", "cacheruntimes": "CacheRuntime",
    "runtime": "CacheRuntime", "runtimes": "CacheRuntime",
    "dataload": "DataLoad", "dataloads": "DataLoad",
    "thinruntime": "ThinRuntime", "thinruntimes": "ThinRuntime",
    "thinruntimeprofile": "ThinRuntimeProfile", "thinruntimeprofiles": "ThinRuntimeProfile",
    "datamigrate": "DataMigrate", "datamigrates": "DataMigrate", "dm": "DataMigrate",
    "dataprocess": "DataProcess", "dataprocesses": "DataProcess", "dp": "DataProcess",
    "juicefsruntime": "JuiceFSRuntime", "juicefsruntimes": "JuiceFSRuntime",
}
FLOWS = ("dataflows", "dataflow")  # `get dataflows`: the runAfter chains of the three step kinds
CLUSTER_SCOPED = {"ThinRuntimeProfile"}  # kept in namespace "default", whatever -n says
_kind = click.Choice(sorted(KIND_NAMES), case_sensitive=False)
class _KindList(click.ParamType):
    """``KIND`` or ``KIND,KIND,...`` (as ``kubectl get dataloads,datamigrates``): a tuple of names,
    each checked as a ``click.Choice`` of the kinds (and ``dataflows``) checks it."""

    name = "kind[,kind...]"
    _choice = click.Choice(sorted([*KIND_NAMES, *FLOWS]), case_sensitive=False)

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        return tuple(self._choice.convert(part, param, ctx) for part in str(value).split(","))


_get_kind = _KindList()
namespace_option = click.option("-n", "--namespace", default="default", show_default=True)
home_option = click.option("--home", envvar="DATACACHE_HOME", default=None,
                           help="State directory (default $DATACACHE_HOME or ~/.local/share/datacache).")


@contextlib.contextmanager
def _tier_warnings_in_status():
    """Quiet the cache tiers' warnings while statuses are refreshed: observing opens every
    runtime's tiers, and an unusable one would print its warning on each ``get``, for runtimes not
    asked about too, where its status already says it (condition ``CacheTiersHealthy``). A filter
    on the tiers' logger, not its level: a level the user configured stays as it was."""
    logger = logging.getLogger("datacache.cache.disk")
    def errors_only(record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR

    logger.addFilter(errors_only)
    try:
        yield
    finally:
        logger.removeFilter(errors_only)


def control_plane(home: str | None):
    """The embedded control plane over ``home`` (``datacache.control.embedded.Embedded``),
    imported here when a command runs: ``datacache --help`` does not load it."""
    from datacache.control.embedded import Embedded

    return Embedded(home)


@click.command()
@click.option("-f", "--filename", "files", multiple=True, required=True, type=click.Path(dir_okay=False),
              help="Resource YAML (several documents allowed); repeat for more files.")
@home_option
def apply(files, home):
    """Create or update resources from YAML files (Dataset, CacheRuntime, ThinRuntime, ThinRuntimeProfile, DataLoad,
    DataMigrate, DataProcess)."""
    from datacache.api.loader import load_resources
    from datacache.control.embedded import ApplyError
    from datacache.errors import error_lines

    plane = control_plane(home)  # first: it registers the URL schemes of stored ThinRuntimeProfiles
    docs = [res for f in files for res in load_resources(f)]  # any invalid document: nothing is stored
    try:
        lines = plane.apply(docs)
    except ApplyError as err:  # the others are applied, each failure is said
        for line in err.lines:
            click.echo(line)
        for failure in err.failures:
            click.echo(error_lines(failure), err=True)
        if any(": stored, but failed: " in f for f in err.failures):  # kept, as kubectl keeps them
            click.echo(f"hint: fix {' and '.join(files)} and apply again, or remove what it stored: "
                       f"datacache delete {' '.join(f'-f {f}' for f in files)}", err=True)
        sys.exit(1)
    for line in lines:
        click.echo(line)


@click.command()
@click.argument("kind", type=_get_kind)
@click.argument("name", required=False)
@click.option("-o", "--output", type=click.Choice(["table", "wide", "yaml", "json"]), default="table")
@namespace_option
@home_option
def get(kind, name, output, namespace, home):
    """List resources with their status (KIND: datasets, runtimes, thinruntimes, dataloads, datamigrates,
    dataprocesses, ...; several joined by commas, as dataloads,datamigrates,dataprocesses; dataflows: each
    runAfter chain with its steps' phases and where it stopped)."""
    if len(kind) > 1:
        if name:
            raise click.UsageError("give one KIND with a NAME (several kinds list them all)")
        for i, one in enumerate(kind):
            if i:
                click.echo("")
            _get_one(one, None, output, namespace, home)
        return
    _get_one(kind[0], name, output, namespace, home)


def _get_one(kind: str, name: str | None, output: str, namespace: str, home: str | None) -> None:
    import yaml

    from datacache.cli.tables import table

    if kind.lower() in FLOWS:
        _get_flows(control_plane(home), namespace)
        return
    kind, namespace = _kind_ns(kind, namespace)
    plane = control_plane(home)
    if name:
        plane.get(kind, name, namespace)
    with _tier_warnings_in_status():
        docs = [d for d in plane.list(kind, namespace) if not name or d["metadata"]["name"] == name]
    if output == "json":
        click.echo(json.dumps(docs[0] if name else {"items": docs}, indent=2, ensure_ascii=False))
    elif output == "yaml":
        click.echo(yaml.safe_dump(docs[0] if name else {"items": docs}, sort_keys=False, allow_unicode=True))
    elif not docs:
        click.echo(f"No {kind} resources found in namespace {namespace}.")
    else:
        click.echo(table(kind, docs, wide=output == "wide"))


@click.command()
@click.argument("kind", type=_kind)
@click.argument("name")
@namespace_option
@home_option
def describe(kind, name, namespace, home):
    """Show one resource in full: spec and status."""
    import yaml

    from datacache.control.dataloads import next_schedule_iso

    kind, namespace = _kind_ns(kind, namespace)
    plane = control_plane(home)
    plane.get(kind, name, namespace)
    with _tier_warnings_in_status():
        plane.refresh_status(kind, name, namespace)
    doc = plane.state.get(kind, name, namespace)
    upcoming = next_schedule_iso(doc) if kind in ("DataLoad", "DataMigrate") else None
    if upcoming:  # computed, not stored: the schedule's next time after the last run
        doc.setdefault("status", {})["nextScheduleTime"] = upcoming
    if kind in ("DataLoad", "DataMigrate", "DataProcess"):
        from datacache.control.flows import flow_of

        flow = flow_of(plane, kind, name, namespace)
        if flow is not None:  # computed: the chain this step is in, and where it stopped
            doc["flow"] = flow
    click.echo(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))


@click.command()
@click.argument("kind", type=_kind, required=False)
@click.argument("name", required=False)
@click.option("-f", "--filename", "files", multiple=True, type=click.Path(dir_okay=False),
              help="Delete the resources these YAML files name (as kubectl delete -f); repeatable.")
@click.option("--force", is_flag=True, help="Delete a Dataset even while it is mounted (unmounts it lazily).")
@click.option("--ignore-not-found", is_flag=True,
              help="A resource that is not there counts as deleted (as kubectl delete --ignore-not-found).")
@namespace_option
@home_option
def delete(kind, name, files, force, ignore_not_found, namespace, home):
    """Delete a resource (KIND NAME), or every resource of YAML files (-f FILE). A Dataset's cached
    blocks (on every worker), manifests, hit counters and DataLoads go with it; a mounted Dataset
    is refused unless --force."""
    if files and (kind or name):
        raise click.UsageError("give KIND NAME or -f FILE, not both")
    if not files:
        if not (kind and name):
            raise click.UsageError("give KIND NAME (e.g. dataset photos) or -f FILE")
        kind, namespace = _kind_ns(kind, namespace)
        plane = control_plane(home)
        if not (ignore_not_found and plane.state.get(kind, name, namespace) is None):
            click.echo(plane.delete(kind, name, namespace, force=force))
        return
    from datacache.api.loader import load_resources
    from datacache.errors import DatacacheError, describe_error, error_lines

    plane = control_plane(home)
    failed = False
    resources = sorted((r for f in files for r in load_resources(f)), key=lambda r: _DELETE_ORDER[r.kind])
    named = {(r.kind, r.metadata.name, r.metadata.namespace) for r in resources}
    for res in resources:
        meta = res.metadata
        if ignore_not_found and plane.state.get(res.kind, meta.name, meta.namespace) is None:
            continue
        try:
            line = plane.delete(res.kind, meta.name, meta.namespace, force=force)
            if any((kind, meta.name, meta.namespace) in named for kind in ("CacheRuntime", "ThinRuntime", "JuiceFSRuntime")):
                line = line.split(" (", 1)[0]  # not "its runtime stays": it goes next
            click.echo(line)
        except (DatacacheError, OSError) as err:  # the others are deleted, each failure is said
            click.echo(error_lines(describe_error(err)), err=True)
            failed = True
    if failed:
        sys.exit(1)


# A Dataset goes before its runtime (its blocks are found through it), a ThinRuntime before its profile.
_DELETE_ORDER = {"DataLoad": 0, "DataMigrate": 0, "DataProcess": 0, "Dataset": 1, "CacheRuntime": 2,
                 "ThinRuntime": 3, "JuiceFSRuntime": 3, "ThinRuntimeProfile": 4}


def _get_flows(plane, namespace: str) -> None:
    from datacache.cli.tables import rows_table
    from datacache.control.flows import flow_rows

    rows = flow_rows(plane, namespace)
    if not rows:
        click.echo(f"No dataflows found in namespace {namespace}.")
        return
    click.echo(rows_table(["FLOW", "STEPS", "PHASE", "STOPPED AT", "REASON"], rows))


def _kind_ns(kind: str, namespace: str) -> tuple[str, str]:
    """The kind a CLI name means, and the namespace to look in (``default`` for cluster-scoped kinds)."""
    kind = KIND_NAMES[kind.lower()]
    return kind, "default" if kind in CLUSTER_SCOPED else namespace


COMMANDS = (apply, get, describe, delete)
