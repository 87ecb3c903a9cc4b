"""The site configuration file: where it is, how it is read, and where training reports go.

One file serves the daemon and the users' side: `--config FILE` (daemon commands), else
`$SHOCKSLURM_CONFIG`, else `/etc/shockslurm/shockslurm.toml`. The daemon validates all of it
(`ops.config`); `shocksub` and the training helper inside jobs read only the report spool
(`report_spool`: `[daemon] spool_dir`), so this module uses the standard library alone (no
policies, no SQLAlchemy): `shocksub` stays fast and a job pays one small TOML parse.

The file is read on the submit host by `shocksub` and, for a job submitted without it (a plain
`sbatch`), on the compute node by the helper: install it world-readable (0644) on every node
and keep secrets out of it (the store's password goes in the daemon's `SHOCKSLURM_DB`).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .errors import ConfigError

DEFAULT_PATH = "/etc/shockslurm/shockslurm.toml"
DEFAULT_CLUSTER = "slurm"           # `[daemon] cluster`'s default (shocksub's --cluster too)
CONFIG_ENV = "SHOCKSLURM_CONFIG"
SPOOL_ENV = "SHOCKSLURM_SPOOL"       # the job's report spool (set by the job script)
SPOOL_KEY = "daemon.spool_dir"


def config_path(cli_path: str | os.PathLike[str] | None, env: Mapping[str, str]) -> Path:
    """`--config`, else `$SHOCKSLURM_CONFIG`, else `/etc/shockslurm/shockslurm.toml`."""
    return Path(cli_path or env.get(CONFIG_ENV) or DEFAULT_PATH)


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A TOML file as a dict; a `ConfigError` naming the file if it cannot be read or parsed."""
    path = Path(path)
    try:
        return tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read the config file: {exc.strerror or exc}",
                          source=str(path)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}", source=str(path)) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text: {exc}", source=str(path)) from None


@dataclass(frozen=True)
class ReportSpool:
    """Where the site's jobs spool their reports: `path`, or None and `origin` says why."""

    path: str | None
    origin: str          # "FILE [daemon] spool_dir" or, without a spool, why there is none

    def describe(self) -> str:
        return f"{self.path} (from {self.origin})" if self.path else self.origin


def report_spool(env: Mapping[str, str]) -> ReportSpool:
    """The site's report spool: `[daemon] spool_dir` of the configuration file (`config_path`).

    No file, or no `spool_dir` in it, is "no spool" (with the reason); a file that cannot be read
    or parsed, or a `spool_dir` that is not an absolute path (a job could not find it) or holds
    a control character, is a
    `ConfigError` naming the file and the key. The daemon's own environment overrides
    (`SHOCKSLURM_DAEMON_SPOOL_DIR`) are not seen by jobs: set the spool in the file."""
    path = config_path(None, env)
    if not path.is_file():
        return ReportSpool(None, f"no site configuration at {path} (${CONFIG_ENV}, else "
                                 f"{DEFAULT_PATH})")
    daemon = read_toml(path).get("daemon", {})
    if not isinstance(daemon, dict):
        raise ConfigError("must be a table", source=str(path), field="daemon")
    value = daemon.get("spool_dir", "")
    if not isinstance(value, str):
        raise ConfigError(f"must be a string (\"\" for none), got {value!r}", source=str(path),
                          field=SPOOL_KEY)
    if not value:
        return ReportSpool(None, f"{path} sets no [daemon] spool_dir")
    if any(c < " " or c == "\x7f" for c in value):
        raise ConfigError(f"must not contain control characters, got {value!r}",
                          source=str(path), field=SPOOL_KEY)
    if not os.path.isabs(value):
        raise ConfigError(f"must be an absolute path for jobs to find it, got {value!r}",
                          source=str(path), field=SPOOL_KEY)
    return ReportSpool(value, f"{path} [daemon] spool_dir")
