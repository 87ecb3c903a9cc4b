"""`shockslurm config`: check the daemon's configuration, print the example or the key table.

    shockslurm config check [--config FILE]   # validate; print the effective configuration
    shockslurm config example                 # contrib/shockslurm.toml (every key, documented)
    shockslurm config keys                    # the README's table of keys (Markdown)
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from ..errors import ConfigError


@click.group("config")
def config_group() -> None:
    """The daemon's configuration file: check it, print an example, list the keys."""


@config_group.command("check")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="TOML file (default: $SHOCKSLURM_CONFIG, else "
                                 "/etc/shockslurm/shockslurm.toml).")
def check_cmd(config_path: Path | None) -> None:
    """Validate the configuration (file + environment) and print the effective values, secrets
    masked, each with where it came from. Exits 1 naming the key on the first error."""
    from ..ops.config import config_path as resolve_path
    from ..masking import mask
    from ..ops.config import effective_toml, load_config

    path = resolve_path(config_path, os.environ)
    try:
        cfg = load_config(path, os.environ)
    except ConfigError as exc:
        raise click.ClickException(mask(str(exc))) from None
    click.echo(f"# {path}: valid")
    click.echo(effective_toml(cfg), nl=False)


@config_group.command("example")
def example_cmd() -> None:
    """Print an example configuration with every key, its default and its meaning."""
    from ..ops.config import example_toml

    click.echo(example_toml(), nl=False)


@config_group.command("keys")
def keys_cmd() -> None:
    """Print the table of configuration keys (Markdown, as in the README)."""
    from ..ops.config import markdown_table

    click.echo(markdown_table(), nl=False)
