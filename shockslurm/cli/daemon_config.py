"""The daemon's configuration as the commands beside it find it (`status`, `db prune`):
`--config`, else `$SHOCKSLURM_CONFIG`, else the default path when that file exists, with the
environment's overrides (`SHOCKSLURM_DB`, `SHOCKSLURM_DAEMON_*`), as the daemon reads it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import click

from ..errors import ShockslurmError

if TYPE_CHECKING:
    from ..ops.config import DaemonConfig


def config_option(what: str) -> Callable[[Any], Any]:
    """`--config FILE`: the daemon's TOML configuration, of which the command reads `what`."""
    return click.option(
        "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
        help=f"The daemon's TOML config ({what}). Default, as the daemon: $SHOCKSLURM_CONFIG, "
             "else /etc/shockslurm/shockslurm.toml when it exists.")


def found_daemon_config(cli_path: Path | None) -> DaemonConfig | None:
    """The daemon's configuration, found as the daemon finds it, with its environment
    overrides; None when neither option nor variable names one and the default file does not
    exist. A configuration that cannot be read is a `ClickException` naming the key."""
    from ..ops.config import CONFIG_ENV, config_path, load_config

    path = config_path(cli_path, os.environ)
    if cli_path is None and not os.environ.get(CONFIG_ENV) and not path.exists():
        return None
    try:
        return load_config(path, os.environ)
    except ShockslurmError as exc:
        raise click.ClickException(str(exc)) from None
