"""Choosing the Slurm backend: the CLI always works; pyslurm only on an exact version match.

pyslurm's setup.py refuses any Slurm whose major.minor differs from its own (25.11.2 needs
25.11), and a mismatched build would talk a wrong RPC protocol, so "auto" picks pyslurm only
when `import pyslurm` works AND `pyslurm.__version__` major.minor equals the running Slurm's
(`sinfo -V`). Otherwise it returns the CLI backend and logs why.
"""

from __future__ import annotations

import importlib
import logging
from types import ModuleType

from ..errors import ConfigError
from .cli_backend import CliBackend
from .types import SlurmBackend, SlurmError, SlurmVersion
from .version import parse_version_text

log = logging.getLogger(__name__)



def pyslurm_usable(slurm: SlurmVersion) -> tuple[ModuleType | None, str]:
    """(module, "") when pyslurm can drive this Slurm, else (None, why not)."""
    try:
        mod = importlib.import_module("pyslurm")
    except Exception as exc:  # ImportError, or a broken build failing to load libslurm
        return None, f"pyslurm not importable ({exc.__class__.__name__}: {exc})"
    raw = str(getattr(mod, "__version__", ""))
    try:
        have = parse_version_text(raw)
    except Exception:
        return None, f"pyslurm.__version__ {raw!r} is unreadable"
    if have.major_minor != slurm.major_minor:
        return None, (f"pyslurm {raw} is built for Slurm {have.major}.{have.minor:02d}, "
                      f"running Slurm is {slurm}")
    return mod, ""


def make_backend(prefer: str = "auto", *, cli: CliBackend | None = None) -> SlurmBackend:
    """The backend to use: `prefer` is auto | cli | pyslurm (a configuration value, checked
    here). `prefer="cli"` never touches pyslurm."""
    if prefer not in ("auto", "cli", "pyslurm"):
        raise ConfigError(f"unknown backend {prefer!r} (auto, cli, pyslurm)", field="backend")
    cli = cli or CliBackend()
    if prefer == "cli":
        return cli
    try:
        slurm = cli.version()
    except SlurmError as exc:
        log.warning("using the CLI backend: cannot detect the Slurm version (%s)", exc)
        return cli
    mod, why = pyslurm_usable(slurm)
    if mod is None:
        level = logging.WARNING if prefer == "pyslurm" else logging.INFO
        log.log(level, "using the CLI backend: %s", why)
        return cli
    from .pyslurm_backend import PyslurmBackend
    log.info("using the pyslurm backend (pyslurm %s, Slurm %s)", mod.__version__, slurm)
    return PyslurmBackend(mod, slurm)
