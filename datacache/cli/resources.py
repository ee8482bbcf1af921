"""Resource verbs: apply, get, describe, delete."""

from __future__ import annotations

import json

import click
import yaml

from datacache.api.loader import load_resources
from datacache.cli.tables import table
from datacache.control.embedded import Embedded

KIND_NAMES = {
    "dataset": "Dataset", "datasets": "Dataset", "ds": "Dataset",
    "cacheruntime": "CacheRuntime", "cacheruntimes": "CacheRuntime",
    "runtime": "CacheRuntime", "runtimes": "CacheRuntime",
    "dataload": "DataLoad", "dataloads": "DataLoad",
}
_kind = click.Choice(sorted(KIND_NAMES), case_sensitive=False)
namespace_option = click.option("-n", "--namespace", default="default", show_default=True)
home_option = click.option("--home", envvar="DATACACHE_HOME", default=None,
                           help="State directory (default $DATACACHE_HOME or ~/.local/share/datacache).")


@click.command()
@click.option("-f", "--filename", "files", multiple=True, required=True, type=click.Path(dir_okay=False),
              help="Resource YAML (several documents allowed); repeat for more files.")
@home_option
def apply(files, home):
    """Create or update resources from YAML files (Dataset, CacheRuntime, DataLoad)."""
    docs = [res for f in files for res in load_resources(f)]
    plane = Embedded(home)
    for line in plane.apply(docs):
        click.echo(line)


@click.command()
@click.argument("kind", type=_kind)
@click.argument("name", required=False)
@click.option("-o", "--output", type=click.Choice(["table", "wide", "yaml", "json"]), default="table")
@namespace_option
@home_option
def get(kind, name, output, namespace, home):
    """List resources with their status (KIND: datasets, runtimes, dataloads)."""
    kind = KIND_NAMES[kind.lower()]
    plane = Embedded(home)
    if name:
        plane.get(kind, name, namespace)
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
    kind = KIND_NAMES[kind.lower()]
    plane = Embedded(home)
    plane.get(kind, name, namespace)
    plane.refresh_status(kind, name, namespace)
    doc = plane.state.get(kind, name, namespace)
    click.echo(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))


@click.command()
@click.argument("kind", type=_kind)
@click.argument("name")
@namespace_option
@home_option
def delete(kind, name, namespace, home):
    """Delete a resource (a Dataset's manifest and cached blocks go with it)."""
    click.echo(Embedded(home).delete(KIND_NAMES[kind.lower()], name, namespace))


COMMANDS = (apply, get, describe, delete)
