"""Scheduling policies behind one contract, and the registry that names them.

The registry is data: each entry says where the policy lives, whether it is a Gavel-style
allocation policy (wrapped in `GavelRounds`) or a round policy, and what it is for. Modules are
imported only when their policy is built, so `fifo` needs no solver.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .gavel_rounds import GavelRounds

if TYPE_CHECKING:   # a type only: policies never import the round loop
    from ..engine import Policy


@dataclass(frozen=True)
class PolicySettings:
    """Settings every policy may read; the defaults reproduce the reference simulator."""

    round_s: float = 120.0
    min_resolve_interval_s: float = 1000.0   # Gavel's re-solve gate
    idle_unallocated: bool = True            # Gavel: new jobs wait for the next re-solve
    options: tuple[tuple[str, Any], ...] = ()  # policy-specific keyword arguments


@dataclass(frozen=True)
class PolicyEntry:
    target: str          # "module:Class", relative to this package
    gavel: bool          # an AllocationPolicy to wrap in GavelRounds
    summary: str
    options: str = ""    # "module:Dataclass" whose fields are the options, for a class that
                         # takes them as **overrides; "" = the constructor's keyword arguments


REGISTRY: dict[str, PolicyEntry] = {
    "max_min_fairness": PolicyEntry("max_min_fairness:MaxMinFairness", True,
                                    "Gavel least-attained-service max-min fairness"),
    "finish_time_fairness": PolicyEntry("finish_time_fairness:FinishTimeFairness", True,
                                        "Themis: minimise the worst finish-time fairness ratio"),
    "allox": PolicyEntry("allox:AlloX", True, "AlloX: min-cost matching, shortest jobs first"),
    "max_sum_throughput": PolicyEntry("max_sum_throughput:MaxSumThroughput", True,
                                      "maximise the sum of iterations/s"),
    "min_total_duration": PolicyEntry("min_total_duration:MinTotalDuration", True,
                                      "OSSP: minimise the time to finish every active job"),
    "gandiva_fair": PolicyEntry("gandiva_fair:GandivaFair", True,
                                "Gandiva-Fair: equal time share per job"),
    "fifo": PolicyEntry("fifo:Fifo", False, "Slurm-like gang FIFO with EASY backfill"),
    "shockwave": PolicyEntry("shockwave:Shockwave", False,
                             "Shockwave: volatile Fisher market with Bayesian forecasts",
                             options="shockwave.config:ShockwaveConfig"),
}


def policy_names() -> list[str]:
    return list(REGISTRY)


def _entry(name: str) -> PolicyEntry:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown policy '{name}' (known: {', '.join(REGISTRY)})") from None


def _load(target: str) -> Any:
    """The class (or function) `module:attribute` of this package names."""
    module_name, attr = target.split(":")
    return getattr(importlib.import_module(f"{__name__}.{module_name}"), attr)


def option_names(name: str) -> tuple[str, ...]:
    """The options (keyword arguments) the named policy takes, sorted."""
    entry = _entry(name)
    if entry.options:
        return tuple(sorted(f.name for f in dataclasses.fields(_load(entry.options))))
    params = inspect.signature(_load(entry.target)).parameters.values()
    return tuple(sorted(p.name for p in params
                        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)))


def make_policy(name: str, settings: PolicySettings = PolicySettings()) -> Policy:
    """Build the named policy as a round `Policy` (see `engine.Policy`)."""
    entry = _entry(name)
    policy = _load(entry.target)(**dict(settings.options))
    if entry.gavel:     # an AllocationPolicy (time fractions), played in Gavel's rounds
        return GavelRounds(policy, round_s=settings.round_s,
                           min_resolve_interval_s=settings.min_resolve_interval_s,
                           idle_unallocated=settings.idle_unallocated)
    round_policy: Policy = policy      # plans rounds itself (shockwave, fifo)
    return round_policy
