"""Data verbs: warmup, verify, sync, ls, cat.

Each command imports the control plane when it runs, not when the module loads: ``datacache
--help`` and light commands stay fast (see ``tests/test_cli_latency.py``)."""

from __future__ import annotations

import errno
import shutil
import sys
import time

import click

from datacache.cli.resources import control_plane, home_option, namespace_option


def split_target(target: str) -> tuple[str, str]:
    """``DATASET[/path]`` (or the same as a ``datacache://`` URL) -> ``(dataset, path)``."""
    dataset, _, path = target.removeprefix("datacache://").strip("/").partition("/")
    if not dataset:
        raise click.BadParameter("give DATASET or DATASET/path", param_hint="TARGET")
    return dataset, path


@click.command()
@click.argument("dataset")
@click.argument("paths", nargs=-1)
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.option("--check", is_flag=True,
              help="Verify the checksum of every cached block (each is read) and load again those that fail; "
                   "without it a block counts as cached when its file is there at its size.")
@click.option("--from-trace", "trace", is_flag=False, flag_value="", default=None, metavar="[RUN]",
              help="Load the files a recorded run read (mount --record, datacache:// record=RUN), in its order; "
                   "without RUN the last one recorded.")
@namespace_option
@home_option
def warmup(dataset, paths, quiet, check, trace, namespace, home):
    """Load DATASET (or PATHS inside it: files, directories, globs) into the cache.

    Exits 1 when any target is missing or could not be cached completely, naming it; Ctrl-C or
    SIGTERM stops it within a second or two (exit 130 or 143), and a new warmup resumes.
    """
    if "/" in dataset:
        name, _, path = dataset.partition("/")
        raise click.BadParameter(f"give the dataset and the paths separately: datacache warmup {name} /{path}",
                                 param_hint="DATASET")
    from datacache.cli.warmupbar import run_warmup

    sys.exit(run_warmup(control_plane(home), dataset, list(paths), namespace, quiet, check, trace))


@click.command()
@click.argument("dataset")
@click.argument("paths", nargs=-1)
@namespace_option
@home_option
def verify(dataset, paths, namespace, home):
    """Check every cached block of DATASET (or of PATHS inside it: files, directories, globs)
    against its recorded checksum; drop the bad ones, so that the next read fetches them again.

    Prints what it checked and dropped, naming each file and block dropped. Exits 1 when it dropped
    something (as fsck(8) does for errors it corrected; warmup also exits 1 when the cache does not
    hold all it should), a path names nothing or a cache worker could not check its blocks, else
    0. With cache workers, each live worker checks its own copies, and this node's file-tier
    copies are checked too.
    """
    from datacache.api.quantity import format_bytes
    from datacache.scrub import scrub

    client = control_plane(home).open_dataset(dataset, namespace)
    try:
        result = scrub(client, list(paths))
    finally:
        client.close()
    blocks, bad = result.total("blocks"), result.total("bad")
    copies = f", {result.copies} file-tier cop{'y' if result.copies == 1 else 'ies'}" if result.copies else ""
    click.echo(f"dataset.datacache.io/{dataset} verified: {blocks} block{'' if blocks == 1 else 's'} "
               f"({format_bytes(result.total('bytes'))}) of {len(result.files)} files{copies} checked, "
               f"{bad} block{'' if bad == 1 else 's'} failed the checksum, "
               f"{format_bytes(result.total('dropped_bytes'))} dropped")
    for f in result.damaged:
        failed = [f"block{'' if len(f.bad) == 1 else 's'} {', '.join(map(str, f.bad))}"] if f.bad else []
        failed += ["its file-tier copy"] if f.copy_failed else []
        click.echo(f"  {f.path}: {' and '.join(failed)} failed the checksum: dropped "
                   f"{format_bytes(f.dropped_bytes)} (the next read fetches it again)")
    for error in result.errors:
        click.echo(f"error: {error}", err=True)
    sys.exit(1 if result.damaged or result.errors else 0)


@click.command()
@click.argument("dataset")
@click.option("-f", "--filename", "files", multiple=True, type=click.Path(dir_okay=False),
              help="Store the resources in these YAML files (the Dataset, its runtime) first, without "
                   "the sync 'apply' would run, so this sync diffs against the stored manifest.")
@click.option("--report-status", type=click.Choice(["kubernetes"]), default=None,
              help="Also write ufsTotal, fileNum and the cache figures into the Dataset's status through "
                   "the Kubernetes API and mark the OnEvent DataLoads whose targets changed (the "
                   "operator's sync Job runs this; needs in-cluster credentials or KUBECONFIG).")
@namespace_option
@home_option
def sync(dataset, files, report_status, namespace, home):
    """Re-list DATASET's mounts: a new manifest; changed files get new versions."""
    from datacache.api.loader import load_resources
    from datacache.state import default_home

    kube = _kube_client() if report_status == "kubernetes" else None  # no API access: fail before any work
    if files:
        _store_without_sync(home or default_home(), [res for f in files for res in load_resources(f)])
    plane = control_plane(home)
    diff = plane.sync(dataset, namespace, on_progress=_sync_progress(dataset))
    added, changed, deleted = diff.counts  # true counts: a huge diff keeps only its first paths in memory
    refreshed = len(diff.refreshed)
    click.echo(f"dataset.datacache.io/{dataset} synced: {added} added, {changed} changed, {deleted} deleted"
               + (f" ({refreshed} more changed file{'' if refreshed == 1 else 's'} refreshed by readers since the "
                  "last sync)" if refreshed else ""))
    if kube is not None:
        from datacache.control.kubestatus import report

        for name in report(plane, dataset, namespace, diff, kube):
            click.echo(f"dataload.datacache.io/{name} marked: its targets changed")
        click.echo(f"dataset.datacache.io/{dataset} status reported")


def _kube_client():
    """A Kubernetes API client for ``--report-status kubernetes`` (see ``kubestatus.connect``)."""
    try:
        from datacache.control.kubestatus import connect
    except ImportError as err:
        raise click.ClickException(f"--report-status kubernetes needs the 'operator' extra ({err}): "
                                   "pip install 'datacache[operator]'") from None
    return connect()


def _store_without_sync(home: str, resources: list) -> None:
    """Store ``resources`` (models) in the state under ``home`` as they are, without the sync that
    ``apply`` runs for a new Dataset: the operator's sync Job starts from a fresh home each time,
    and its one sync must diff the manifest kept on its claim, not one made a moment earlier."""
    from datacache.api.loader import to_document
    from datacache.state import StateStore

    state = StateStore(home)
    try:
        for res in resources:
            doc = to_document(res)
            doc.pop("status", None)
            state.put(doc)
    finally:
        state.close()


def _sync_progress(dataset: str, every_s: float = 2.0):
    """``on_progress`` for a long sync: ``dataset.datacache.io/NAME: N files listed`` on stderr, at
    most every ``every_s`` seconds, silent for a sync that finishes in less."""
    start = last = time.monotonic()

    def report(listed: int) -> None:
        nonlocal last
        now = time.monotonic()
        if now - start >= every_s and now - last >= every_s:
            last = now
            click.echo(f"dataset.datacache.io/{dataset}: {listed} files listed", err=True)
    return report


@click.command(name="ls")
@click.argument("target")
@click.option("-l", "long", is_flag=True, help="Sizes (bytes) and cached percentages (of bytes, rounded down).")
@namespace_option
@home_option
def ls_(target, long, namespace, home):
    """List a directory of a dataset: DATASET[/path]. A dataset without a runtime lists too
    (nothing of it is cached)."""
    from datacache.control.reconcile import percentage

    dataset, path = split_target(target)
    plane = control_plane(home)
    if plane.runtime_for(plane.get("Dataset", dataset, namespace)) is None:
        names, client = plane.paths.namespace(dataset, namespace), None
    else:
        client = plane.open_dataset(dataset, namespace)
        names = client.namespace
    try:
        entry = names.stat(path)
        children = {path.rsplit("/", 1)[-1]: entry} if entry is not None else names.listdir(path)
        for name, e in sorted(children.items()):
            if not long:
                click.echo(name + ("/" if e is None else ""))
            elif e is None:
                click.echo(f"{'dir':>12}  {'':>7}  {name}/")
            else:
                held = client.cached_bytes([e]) if client is not None else 0
                cached = percentage(held, e.size) if e.size else "100.0%"
                click.echo(f"{e.size:>12}  {cached:>7}  {name}")
    finally:
        if client is not None:
            client.close()


@click.command()
@click.argument("target")
@namespace_option
@home_option
def cat(target, namespace, home):
    """Write a dataset file to standard output: DATASET/path."""
    dataset, path = split_target(target)
    if not path.strip("/"):
        raise IsADirectoryError(errno.EISDIR, "is a directory (the dataset's root): give DATASET/path of a file",
                                target)
    client = control_plane(home).open_dataset(dataset, namespace)
    try:  # a closed pipe (`| head`) ends it quietly: see datacache.cli._Group
        with client.open(path) as f:
            shutil.copyfileobj(f, sys.stdout.buffer, 4 << 20)
    finally:
        client.close()


COMMANDS = (warmup, verify, sync, ls_, cat)
