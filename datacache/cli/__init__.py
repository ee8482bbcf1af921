"""The ``datacache`` command (click + rich).

User mistakes (bad YAML, unknown resources, missing paths) print one clear ``error:`` line and exit
1, without a traceback; :func:`main` is the console entry point.
"""

from __future__ import annotations

import sys

import click

from datacache.cli import cluster, controller, crds, data, resources
from datacache.errors import DatacacheError


class _Group(click.Group):
    """Turns expected errors into one line on stderr and exit status 1."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (DatacacheError, OSError) as err:
            click.echo(f"error: {_describe(err)}", err=True)
            sys.exit(1)


def _describe(err: BaseException) -> str:
    if isinstance(err, OSError) and err.strerror:
        where = f"{err.filename}: " if err.filename else ""
        return f"{where}{err.strerror}"
    return str(err)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="datacache")
def cli() -> None:
    """datacache: cache datasets close to training, warm them up, read them as files."""


for command in (*resources.COMMANDS, *data.COMMANDS, *cluster.COMMANDS, *crds.COMMANDS, *controller.COMMANDS):
    cli.add_command(command)

try:  # FUSE needs the 'fuse' extra (pyfuse3, Debian's libfuse3)
    from datacache_fuse.cli import mount, unmount

    cli.add_command(mount)
    cli.add_command(unmount)
except ImportError as _err:  # pragma: no cover - only without the extra
    _missing = str(_err)

    @cli.command(context_settings={"ignore_unknown_options": True})
    @click.argument("args", nargs=-1)
    def mount(args):
        """Mount a dataset (needs the 'fuse' extra)."""
        raise click.ClickException(f"FUSE support is not installed ({_missing}): pip install 'datacache[fuse]'")


def main() -> None:
    cli(prog_name="datacache")
