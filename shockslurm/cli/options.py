"""Option shapes several commands share (`simulate`, `bench live`, `bench quality`, ...): one
declaration each, so that the same option reads and checks the same way everywhere."""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import click

from ..policies import REGISTRY
from .paths import OutputDir, OutputFile

FC = TypeVar("FC", bound=Callable[..., Any])


def json_option(help: str) -> Callable[[FC], FC]:
    """`--json FILE` (the command's `json_out`), checked when the command line is read."""
    return click.option("--json", "json_out", type=OutputFile(), help=help)


def plot_option(help: str) -> Callable[[FC], FC]:
    """`--plot DIR` (the command's `plot_dir`), checked when the command line is read."""
    return click.option("--plot", "plot_dir", type=OutputDir(), help=help)


def policy_list(value: str, option: str = "--policy") -> list[str]:
    """`--policy a,b`: the named policies, or a usage error naming the unknown ones (and
    `option`)."""
    names = [p.strip() for p in value.split(",") if p.strip()]
    unknown = [p for p in names if p not in REGISTRY]
    if unknown or not names:
        raise click.BadParameter(f"unknown policy {', '.join(unknown) or '(none)'}; known: "
                                 f"{', '.join(REGISTRY)}", param_hint=option)
    return names


def policy_option_flag(help: str = "") -> Callable[[FC], FC]:
    """`--policy-option KEY=VALUE` (repeatable; the command's `policy_option`)."""
    return click.option(
        "--policy-option", "policy_option", multiple=True, metavar="KEY=VALUE",
        help="A policy option (repeatable) for the chosen policies that take it, e.g. "
             "'tail_weight=10' for shockwave; VALUE is read as TOML (else as a string)."
             + (" " + help if help else ""))


def benchmark_policy_options(names: list[str], assignments: tuple[str, ...], *,
                             sets_itself: str) -> dict[str, dict[str, Any]]:
    """Each of `names`'s options from `--policy-option`, validated as the daemon validates
    `[policy]`. A benchmark sets the policy settings (`PolicySettings`: round length, gate)
    itself, so such a key is a `ConfigError` saying so (`sets_itself`)."""
    from ..errors import ConfigError
    from ..ops.config import SETTINGS_KEYS, assign_policy_options, parse_policy_assignments

    given = parse_policy_assignments(assignments, "--policy-option")
    for name in given:
        if name in SETTINGS_KEYS:
            raise ConfigError(f"the benchmark sets this itself ({sets_itself})",
                              source="--policy-option", field=f"policy.{name}")
    return assign_policy_options(names, given, dict.fromkeys(given, "--policy-option"))
