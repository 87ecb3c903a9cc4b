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
