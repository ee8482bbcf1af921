"""``datacache demo``: the main job end to end (its module, :mod:`.demojob`, is imported only when it runs)."""

from __future__ import annotations

import sys

import click


@click.command()
@click.option("--files", "n_jpeg", default=2000, show_default=True, help="JPEG files in the image tree.")
@click.option("--shard-mib", default=256, show_default=True, help="Size of the tar shard (MiB).")
@click.option("--keep", is_flag=True, help="Keep the demo's state directory afterwards.")
def demo(n_jpeg, shard_mib, keep):
    """The main job end to end: S3 + local source, apply, warmup, read back, verify, status."""
    from datacache.cli.demojob import run_demo

    sys.exit(run_demo(n_jpeg=n_jpeg, shard_bytes=shard_mib << 20, keep=keep))


COMMANDS = (demo,)
