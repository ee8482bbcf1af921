"""``python -m datacache_fuse mount|unmount ...``: the FUSE commands without the ``datacache`` CLI.

Background daemons and supervisors are started this way (``sys.executable -m datacache_fuse``),
so they run with the same interpreter and environment as the command that started them.
"""

import click

from datacache_fuse.cli import mount, unmount


@click.group()
def main() -> None:
    """datacache FUSE mount commands."""


main.add_command(mount)
main.add_command(unmount)

if __name__ == "__main__":
    main(prog_name="python -m datacache_fuse")
