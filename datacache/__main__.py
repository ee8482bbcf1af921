"""``python -m datacache`` is the ``datacache`` command."""

from datacache.cli import main

main()
