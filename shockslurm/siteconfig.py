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
import stat
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
# The largest configuration file read (`contrib/shockslurm.toml`, every key documented, is 7 KB):
# a larger one, or /dev/zero, is refused before it fills the memory.
MAX_CONFIG_BYTES = 1 << 20


def config_path(cli_path: str | os.PathLike[str] | None, env: Mapping[str, str]) -> Path:
    """`--config`, else `$SHOCKSLURM_CONFIG`, else `/etc/shockslurm/shockslurm.toml`."""
    return Path(cli_path or env.get(CONFIG_ENV) or DEFAULT_PATH)


def check_directory(value: object) -> str:
    """A directory setting (`[daemon] spool_dir`, `rejected_dir`): "" (none) or an absolute path
    without control characters, one rule for the daemon, `shockslurm config check`, shocksub and
    the jobs (a relative path means another directory on each node; a NUL cannot be opened). A
    ValueError says what is wrong otherwise."""
    if not isinstance(value, str):
        raise ValueError('must be a string ("" for none)')
    if any(c < " " or c == "\x7f" for c in value):
        raise ValueError("must not contain control characters")
    if value and not os.path.isabs(value):
        raise ValueError('must be an absolute path ("" for none)')
    return value


MAX_CLUSTER_CHARS = 64


def check_cluster(value: object) -> str:
    """A cluster name (`[daemon] cluster`, `shocksub --cluster`): a non-empty printable string
    of at most `MAX_CLUSTER_CHARS` characters, one rule for the daemon, `config check` and
    shocksub (a spec registered under a name no daemon reads is never found; a NUL cannot be
    stored). A ValueError says what is wrong otherwise."""
    if not isinstance(value, str) or not value:
        raise ValueError("must be a non-empty string")
    if not value.isprintable() or len(value) > MAX_CLUSTER_CHARS:
        raise ValueError(f"must be printable, at most {MAX_CLUSTER_CHARS} characters")
    return value


def _read_capped(path: Path) -> bytes:
    """The bytes of `path` if it is a regular file of at most `MAX_CONFIG_BYTES`, else a
    `ConfigError`. Opened without blocking (a FIFO would wait for a writer) and checked on the
    open file before anything is read; at most one byte over the cap is read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = "a directory" if stat.S_ISDIR(mode) else "a device, FIFO or socket"
            raise ConfigError(f"not a regular file ({what})", source=str(path))
        with open(fd, "rb", closefd=False) as file:
            data = file.read(MAX_CONFIG_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"larger than {MAX_CONFIG_BYTES:,} bytes: not a configuration file",
                          source=str(path))
    return data


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A TOML file as a dict; a `ConfigError` naming the file if it cannot be read or parsed, is
    not a regular file, or is larger than `MAX_CONFIG_BYTES` (or saying that the path is
    empty)."""
    if os.fspath(path) in ("", "."):    # click hands `--config ''` over as Path("") == "."
        raise ConfigError('the configuration file\'s path is empty (or "."): name a TOML file')
    path = Path(path)
    try:
        data = _read_capped(path)
    except OSError as exc:
        raise ConfigError(f"cannot read the config file: {exc.strerror or exc}",
                          source=str(path)) from None
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text: {exc}", source=str(path)) from None
    except ValueError as exc:       # TOMLDecodeError, or an integer of over 4,300 digits
        raise ConfigError(f"not valid TOML: {exc}", source=str(path)) from None
    except RecursionError:          # arrays nested some thousand deep
        raise ConfigError("not usable TOML: its values are nested too deep",
                          source=str(path)) from None


@dataclass(frozen=True)
class ReportSpool:
    """Where the site's jobs spool their reports: `path`, or None and `origin` says why."""

    path: str | None
    origin: str          # "FILE [daemon] spool_dir" or, without a spool, why there is none

    def describe(self) -> str:
        return f"{self.path} (from {self.origin})" if self.path else self.origin


def report_spool(env: Mapping[str, str]) -> ReportSpool:
    """The site's report spool: `[daemon] spool_dir` of the configuration file (`config_path`).

    No file, or no `spool_dir` in it, is "no spool" (with the reason); a file that `read_toml`
    refuses, or a `spool_dir` that `check_directory` refuses (the daemon's rule), is a
    `ConfigError` naming the file and the key. The daemon's own environment overrides
    (`SHOCKSLURM_DAEMON_SPOOL_DIR`) are not seen by jobs: set the spool in the file."""
    path = config_path(None, env)
    if not path.exists():
        return ReportSpool(None, f"no site configuration at {path} (${CONFIG_ENV}, else "
                                 f"{DEFAULT_PATH})")
    daemon = read_toml(path).get("daemon", {})
    if not isinstance(daemon, dict):
        raise ConfigError("must be a table", source=str(path), field="daemon")
    value = daemon.get("spool_dir", "")
    try:
        spool = check_directory(value)
    except ValueError as exc:
        raise ConfigError(f"{exc}, got {value!r}", source=str(path), field=SPOOL_KEY) from None
    if not spool:
        return ReportSpool(None, f"{path} sets no [daemon] spool_dir")
    return ReportSpool(spool, f"{path} [daemon] spool_dir")
