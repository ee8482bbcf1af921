"""``datacache crds``: print the CustomResourceDefinitions (YAML) for ``kubectl apply -f -``."""

from __future__ import annotations

import click


@click.command(name="crds")
def crds() -> None:
    """Print the CRDs of Dataset, CacheRuntime, ThinRuntime, ThinRuntimeProfile and DataLoad."""
    import yaml

    from datacache.api.crds import crds as all_crds

    click.echo(yaml.safe_dump_all(all_crds(), sort_keys=False), nl=False)


COMMANDS = [crds]
