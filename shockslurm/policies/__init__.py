"""Scheduling policies behind one contract, and the registry that names them.

The registry is data: each entry says where the policy lives, whether it is a Gavel-style
allocation policy (wrapped in `GavelRounds`) or a round policy, and what it is for. Modules are
imported only when their policy is built, so `fifo` needs no solver.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from .gavel_rounds import GavelRounds


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
                             "Shockwave: volatile Fisher market with Bayesian forecasts"),
}


def policy_names() -> list[str]:
    return list(REGISTRY)


def make_policy(name: str, settings: PolicySettings = PolicySettings()):
    """Build the named policy as a round `Policy` (see `engine.Policy`)."""
    try:
        entry = REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown policy '{name}' (known: {', '.join(REGISTRY)})") from None
    module_name, cls_name = entry.target.split(":")
    cls = getattr(importlib.import_module(f"{__name__}.{module_name}"), cls_name)
    policy = cls(**dict(settings.options))
    if entry.gavel:
        return GavelRounds(policy, round_s=settings.round_s,
                           min_resolve_interval_s=settings.min_resolve_interval_s,
                           idle_unallocated=settings.idle_unallocated)
    return policy
