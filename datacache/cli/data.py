"""Data verbs: warmup, sync, ls, cat."""

from __future__ import annotations

import contextlib
import errno
import shutil
import signal
import sys
import threading
import time

import click
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn
from rich.text import Text

from datacache.api.quantity import format_bytes
from datacache.cli.resources import home_option, namespace_option
from datacache.api.loader import load_resources, to_document
from datacache.control.embedded import Embedded
from datacache.state import StateStore, default_home


def split_target(target: str) -> tuple[str, str]:
    """``DATASET[/path]`` -> ``(dataset, path)``."""
    dataset, _, path = target.strip("/").partition("/")
    if not dataset:
        raise click.BadParameter("give DATASET or DATASET/path", param_hint="TARGET")
    return dataset, path


class SignalCancel(threading.Event):
    """An Event set by the first SIGINT or SIGTERM; ``signum`` says which (0 before)."""

    signum = 0

    @property
    def exit_status(self) -> int:
        """128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM), as a shell reports a
        command the signal stopped."""
        return 128 + self.signum


@contextlib.contextmanager
def cancel_on_signals():
    """A :class:`SignalCancel` set by Ctrl-C (SIGINT) or SIGTERM while the block runs, so a long
    job can stop cleanly (its status written, nothing half-stored) instead of dying mid-write."""
    cancel = SignalCancel()

    def handler(signum, _frame):
        cancel.signum = cancel.signum or signum
        cancel.set()
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield cancel
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class LoadRateColumn(ProgressColumn):
    """The bar's rate: bytes loaded from the UFS per second since the start, in binary units
    (``12.50MiB/s``), the same figure as the summary line (blocks already cached are skipped and
    count in the bar's bytes, not in the rate)."""

    def render(self, task) -> Text:
        elapsed = task.elapsed or 0.0
        rate = task.fields.get("loaded", 0) / elapsed if elapsed > 0 else 0.0
        return Text(f"{format_bytes(rate)}/s", style="progress.data.speed")


def run_warmup(plane: Embedded, dataset: str, paths: list[str], namespace: str = "default",
               quiet: bool = False, check: bool = False) -> int:
    """Warm up with a live progress bar (files, bytes, rate, ETA) on stderr and a summary on
    stdout; returns the exit status: 0 when every target is Complete, 1 when one is not, 130
    (Ctrl-C) or 143 (SIGTERM) when a signal cancelled it within about a second (phase
    Cancelled, one summary line: a new warmup loads only the rest)."""
    plane.bound(dataset, namespace)  # a missing dataset or runtime fails before any bar is drawn
    columns = (TextColumn("[bold]warmup"), BarColumn(), TextColumn("{task.fields[files]} files"),
               DownloadColumn(binary_units=True), LoadRateColumn(), TimeRemainingColumn())
    with cancel_on_signals() as cancel, Progress(*columns, console=Console(stderr=True), disable=quiet) as bar:
        task = bar.add_task("warmup", total=None, files="0/?", loaded=0)

        def on_progress(p):
            bar.update(task, total=p.bytes_total, completed=p.bytes_done, files=f"{p.files_done}/{p.files_total}",
                       loaded=p.bytes_loaded)

        name, result = plane.warmup(dataset, paths, namespace, on_progress=on_progress, cancel=cancel, check=check)
    rate = result.loaded_bytes / result.duration if result.duration else 0.0
    loaded = f"{format_bytes(result.loaded_bytes)} loaded from the UFS ({format_bytes(rate)}/s)"
    if result.phase == "Cancelled":
        click.echo(f"dataload.datacache.io/{name}: Cancelled after {result.duration:.1f}s: "
                   f"{format_bytes(result.total('cached_bytes'))} of {format_bytes(result.total('bytes'))} cached "
                   f"({result.total('cached_files')} of {result.total('files')} files complete), {loaded}; "
                   f"the same warmup again loads only the rest")
        for failure in (f for t in result.targets for f in t.failures):  # files that failed, not those left
            click.echo(f"    failed: {failure}")
        return cancel.exit_status
    click.echo(f"dataload.datacache.io/{name}: {result.phase} in {result.duration:.1f}s, {loaded}")
    for t in result.targets:
        files = f"{t.files} file{'' if t.files == 1 else 's'}"
        click.echo(f"  {t.path}: {t.phase}: {files}, {format_bytes(t.cached_bytes)} of {format_bytes(t.bytes)} cached")
        for failure in t.failures:
            click.echo(f"    failed: {failure}")
    if not result.ok:
        failed = ", ".join(t.path for t in result.targets if t.phase != "Complete")
        click.echo(f"error: warmup incomplete for: {failed}", err=True)
        return 1
    return 0


@click.command()
@click.argument("dataset")
@click.argument("paths", nargs=-1)
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.option("--check", is_flag=True,
              help="Verify the checksum of every cached block (each is read) and load again those that fail; "
                   "without it a block counts as cached when its file is there at its size.")
@namespace_option
@home_option
def warmup(dataset, paths, quiet, check, namespace, home):
    """Load DATASET (or PATHS inside it: files, directories, globs) into the cache.

    Exits 1 when any target is missing or could not be cached completely, naming it; Ctrl-C or
    SIGTERM stops it within a second or two (exit 130 or 143), and a new warmup resumes.
    """
    if "/" in dataset:
        name, _, path = dataset.partition("/")
        raise click.BadParameter(f"give the dataset and the paths separately: datacache warmup {name} /{path}",
                                 param_hint="DATASET")
    sys.exit(run_warmup(Embedded(home), dataset, list(paths), namespace, quiet, check))


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
    kube = _kube_client() if report_status == "kubernetes" else None  # no API access: fail before any work
    if files:
        _store_without_sync(home or default_home(), [res for f in files for res in load_resources(f)])
    plane = Embedded(home)
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
@click.option("-l", "long", is_flag=True, help="Sizes (bytes) and cached fractions.")
@namespace_option
@home_option
def ls_(target, long, namespace, home):
    """List a directory of a dataset: DATASET[/path]."""
    dataset, path = split_target(target)
    client = Embedded(home).open_dataset(dataset, namespace)
    try:
        entry = client.stat(path)
        children = {path.rsplit("/", 1)[-1]: entry} if entry is not None else client.listdir(path)
        for name, e in sorted(children.items()):
            if not long:
                click.echo(name + ("/" if e is None else ""))
            elif e is None:
                click.echo(f"{'dir':>12}  {'':>7}  {name}/")
            else:
                click.echo(f"{e.size:>12}  {100 * client.cached_fraction(e):6.1f}%  {name}")
    finally:
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
    client = Embedded(home).open_dataset(dataset, namespace)
    try:  # a closed pipe (`| head`) ends it quietly: see datacache.cli._Group
        with client.open(path) as f:
            shutil.copyfileobj(f, sys.stdout.buffer, 4 << 20)
    finally:
        client.close()


COMMANDS = (warmup, sync, ls_, cat)
