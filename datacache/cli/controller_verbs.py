"""``datacache controller``: run the embedded controller (Cron and OnEvent DataLoads, autoSync,
autoscaling) in the foreground until Ctrl-C or SIGTERM."""

from __future__ import annotations

import logging
import sys

import click

from datacache.cli.signals import cancel_on_signals
from datacache.cli.resources import home_option


@click.command()
@click.option("--interval", type=click.FloatRange(min=0.1), default=1.0, show_default=True,
              help="Seconds between passes over the resources.")
@click.option("--once", is_flag=True, help="Make one pass and exit (for cron jobs and scripts).")
@home_option
def controller(interval, once, home):
    """Fire Cron DataLoads, sync Datasets with autoSyncInterval (which fires OnEvent DataLoads),
    and apply CacheRuntimes' autoscale policies. Logs one line per action on stderr."""
    from datacache.control.controller import Controller
    from datacache.control.embedded import Embedded

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ctl = Controller(Embedded(home))
    if once:
        ctl.tick()
        return
    with cancel_on_signals() as stop:
        ctl.run(stop, interval)


COMMANDS = (controller,)
