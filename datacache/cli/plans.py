"""``datacache plan``: publish the order a job will read a dataset in (see :mod:`datacache.plan`)."""

from __future__ import annotations

import click

from datacache.cli.resources import control_plane, home_option, namespace_option


@click.command("plan")
@click.argument("dataset")
@click.option("--order", "order_file", type=click.File("r"), default=None,
              help="File of dataset paths in read order, one a line ('-': stdin); blank lines are skipped.")
@click.option("--epoch", type=int, default=-1, help="The epoch this order is for (shown only).")
@click.option("--rank", type=int, default=None, help="Whose share of the epoch this is (default 0).")
@click.option("--world", type=int, default=1, show_default=True, help="How many ranks share the epoch.")
@click.option("--clear", is_flag=True, help="Withdraw the plan of --rank (every rank's without --rank): LRU again.")
@namespace_option
@home_option
def plan(dataset, order_file, epoch, rank, world, clear, namespace, home):
    """Tell the cache the order DATASET's files will be read in.

    Readers of the dataset on this node (the FUSE mount, datacache:// clients) then load the files
    in that order ahead of the reader and evict what the order needs last. A new plan replaces
    the rank's last one (publish one per epoch). Paths not in the dataset, given twice or of
    another dataset are refused, naming them.
    """
    from datacache.api.quantity import format_bytes
    from datacache.stack.plans import publish_plan, withdraw_plans

    plane = control_plane(home)
    try:
        if clear:
            n = withdraw_plans(plane.home, dataset, namespace, rank)
            click.echo(f"plan of dataset {dataset}: {n} withdrawn")
            return
        if order_file is None:
            raise click.UsageError("give --order FILE (dataset paths in read order, one a line) or --clear")
        rank = rank or 0
        order = [line.rstrip("\n") for line in order_file if line.strip()]
        made, path = publish_plan(plane.paths, dataset, order, namespace, epoch, rank, world)
        manifest = plane.paths.load_manifest(plane.paths.get("Dataset", dataset, namespace))
        size = sum(manifest.lookup(p).size for p in made.paths)
        click.echo(f"plan of dataset {dataset} (rank {rank} of {world}): {len(made.paths)} files, "
                   f"{format_bytes(size)}, in {path}")
    finally:
        plane.close()


COMMANDS = (plan,)
