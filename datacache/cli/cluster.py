"""Cluster verbs: ``datacache worker serve|list`` and ``datacache scale cacheruntime``."""

from __future__ import annotations

import logging
import sys

import click

from datacache.api.quantity import format_bytes
from datacache.cli.resources import KIND_NAMES, control_plane, home_option, namespace_option


@click.group()
def worker():
    """Cache workers of a CacheRuntime (embedded mode starts them on 'apply' with replicas >= 2)."""


@worker.command()
@click.argument("name")
@click.option("--index", type=click.IntRange(min=0), default=0, show_default=True, help="Worker number i (worker-i).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True, help="Port (0: any free port).")
@click.option("--advertise", default=None, help="Host name clients use to reach it (default: --host).")
@click.option("--exit-with-parent", is_flag=True, hidden=True)
@namespace_option
@home_option
def serve(name, index, host, port, advertise, exit_with_parent, namespace, home):
    """Run worker INDEX of CacheRuntime NAME in the foreground until SIGTERM."""
    from datacache.stack.workerproc import serve as run

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    plane = control_plane(home)
    home = plane.home
    plane.close()
    run(home, namespace, name, index, host, port, advertise, exit_with_parent)


@worker.command(hidden=True)
@click.argument("name")
@namespace_option
@home_option
def supervise(name, namespace, home):
    """Supervise the workers of CacheRuntime NAME (the daemon 'apply' starts)."""
    from datacache.control.supervisor import Supervisor

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    plane = control_plane(home)
    home = plane.home
    plane.close()
    sys.exit(Supervisor(home, namespace, name).run())


@worker.command(name="list")
@click.argument("name")
@namespace_option
@home_option
def list_(name, namespace, home):
    """Workers of CacheRuntime NAME: ready, address, pid, cache use."""
    from datacache.cli.tables import rows_table
    from datacache.cluster.status import observe_workers

    plane = control_plane(home)
    workers = observe_workers(plane.home, plane.get("CacheRuntime", name, namespace))
    rows = [[w["name"], "yes" if w["ready"] else "no", w["url"], str(w["pid"] or ""), format_bytes(w["used"]),
             format_bytes(w["capacity"])] for w in workers]
    click.echo(rows_table(["WORKER", "READY", "URL", "PID", "USED", "CAPACITY"], rows))


@click.command()
@click.argument("kind", type=click.Choice(["cacheruntime", "cacheruntimes", "runtime", "runtimes"]))
@click.argument("name")
@click.option("--replicas", type=click.IntRange(min=0), required=True, help="Number of cache workers.")
@namespace_option
@home_option
def scale(kind, name, replicas, namespace, home):
    """Grow or shrink a CacheRuntime's workers: datacache scale cacheruntime NAME --replicas N."""
    assert KIND_NAMES[kind] == "CacheRuntime"
    click.echo(control_plane(home).scale(name, replicas, namespace))


COMMANDS = (worker, scale)
