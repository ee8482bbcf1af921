"""``datacache warmup``'s progress bar (rich) and summary; imported only when a warmup runs."""

from __future__ import annotations

import click
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn
from rich.text import Text

from datacache import procmem
from datacache.api.quantity import format_bytes
from datacache.cli.signals import cancel_on_signals
from datacache.control.embedded import Embedded


class LoadRateColumn(ProgressColumn):
    """The bar's rate: bytes loaded from the UFS per second since the load started (the bar
    appears then, not while the dataset is opened), in binary units (``12.50MiB/s``); its last
    frame shows the summary line's figure (field ``rate``). Blocks already cached are skipped and
    count in the bar's bytes, not in the rate."""

    def render(self, task) -> Text:
        rate = task.fields.get("rate")  # set once the load is over: the summary's own figure
        if rate is None:
            elapsed = task.elapsed or 0.0
            rate = task.fields.get("loaded", 0) / elapsed if elapsed > 0 else 0.0
        return Text(f"{format_bytes(rate)}/s", style="progress.data.speed")


def run_warmup(plane: Embedded, dataset: str, paths: list[str], namespace: str = "default",
               quiet: bool = False, check: bool = False, trace: str | None = None) -> int:
    """Warm up with a live progress bar (files, bytes, rate, ETA) on stderr and a summary on
    stdout; returns the exit status: 0 when every target is Complete, 1 when one is not, 130
    (Ctrl-C) or 143 (SIGTERM) when a signal cancelled it within about a second (phase
    Cancelled, one summary line: a new warmup loads only the rest)."""
    plane.bound(dataset, namespace)  # a missing dataset or runtime fails before any bar is drawn
    procmem.keep_blocks_malloc()  # before the segment threads start: see datacache.procmem
    procmem.freeze_gc()
    columns = (TextColumn("[bold]warmup"), BarColumn(), TextColumn("{task.fields[files]} files"),
               DownloadColumn(binary_units=True), LoadRateColumn(), TimeRemainingColumn())
    bar = Progress(*columns, console=Console(stderr=True), disable=quiet)
    task = None

    def on_progress(p):
        nonlocal task
        if task is None and p.files_total:  # the load has started: opening the dataset (a sync, say) went well
            bar.start()
            task = bar.add_task("warmup", total=None, files="0/?", loaded=0)
        if task is not None:
            bar.update(task, total=p.bytes_total, completed=p.bytes_done, files=f"{p.files_done}/{p.files_total}",
                       loaded=p.bytes_loaded)

    try:
        with cancel_on_signals() as cancel:
            name, result = plane.warmup(dataset, paths, namespace, on_progress=on_progress, cancel=cancel,
                                        check=check, trace=trace)
        if task is not None:  # the last frame shows the summary's rate, over the same duration
            bar.update(task, rate=result.loaded_bytes / result.duration if result.duration else 0.0)
            if not result.ok:  # and what is cached: a failed or evicted file's bytes were gone over, not kept
                total = next(t.total for t in bar.tasks if t.id == task) or 0
                bar.update(task, completed=min(result.total("cached_bytes"), total),
                           files=f"{result.total('cached_files')}/{result.total('files')}")
    finally:
        if task is not None:
            bar.stop()
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
    if not result.total("files") and all(t.failures for t in result.targets):  # nothing selected: only why
        for failure in (f for t in result.targets for f in t.failures):
            click.echo(f"error: {failure}", err=True)
        return 1
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
