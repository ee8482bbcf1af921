"""The ``datacache`` command (click + rich).

User mistakes (bad YAML, unknown resources, missing paths) print one clear ``error:`` line and exit
1, without a traceback; :func:`main` is the console entry point.
"""

from __future__ import annotations

import os
import sys

import click

from datacache.cli import cluster, controller_verbs, crd_verbs, data, plans, resources, rundemo
from datacache.errors import DatacacheError, describe_error, error_lines
from datacache_fuse.cli import mount, unmount


class _Group(click.Group):
    """Turns expected errors into one ``error: ...`` line on stderr and exit status 1 (a closed
    stdout pipe ends a command quietly)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:  # `datacache ls ... | head`: the reader has all it wanted, as for coreutils
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        except (DatacacheError, OSError) as err:
            click.echo(error_lines(describe_error(err)), err=True)
            sys.exit(1)
        except click.UsageError:
            raise  # click's usage text, then its "Error: ..." line, exit 2
        except click.ClickException as err:  # raised by commands (mount, unmount): same form as the rest
            click.echo(error_lines(err.format_message()), err=True)
            sys.exit(err.exit_code)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="datacache")
def cli() -> None:
    """datacache: cache datasets close to training, warm them up, read them as files."""


for command in (*resources.COMMANDS, *data.COMMANDS, *rundemo.COMMANDS, *cluster.COMMANDS, *crd_verbs.COMMANDS,
                *controller_verbs.COMMANDS, *plans.COMMANDS, mount, unmount):
    cli.add_command(command)


def main() -> None:
    cli(prog_name="datacache")
