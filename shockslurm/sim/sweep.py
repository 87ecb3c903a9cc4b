"""How policies degrade as a switch costs more: one simulation per workload, policy and restart
overhead, and the medians over workloads (`shockslurm bench switch-cost`).

A switch is a job that runs after not running in the previous round, or on other nodes than it
ran on (`sim.cluster`); it loses `restart_overhead_s` of its round.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Callable, Mapping, Sequence

from ..model import JobSpec
from .run import SimConfig, simulate

SWEEP_METRICS = ("makespan_s", "avg_jct_s", "worst_rho", "utilization")


def switch_cost_runs(workloads: Sequence[Sequence[JobSpec]], policies: Sequence[str],
                     overheads: Sequence[float], base: SimConfig,
                     progress: Callable[[str], None] | None = None,
                     options: Mapping[str, Mapping[str, Any]] | None = None
                     ) -> list[dict[str, Any]]:
    """One row per (workload index, policy, restart overhead) with the run's `SWEEP_METRICS`;
    `options`: each policy's options (policy -> its keyword arguments)."""
    rows = []
    for w, jobs in enumerate(workloads):
        for overhead in overheads:
            config = dataclasses.replace(base, restart_overhead_s=float(overhead))
            for policy in policies:
                if progress is not None:
                    progress(f"workload {w + 1}/{len(workloads)}, {policy}, {overhead:g} s")
                given = (options or {}).get(policy) or None
                m = simulate(jobs, policy, config, policy_options=given).as_dict()
                rows.append({"workload": w, "policy": policy, "restart_overhead_s": overhead,
                             **{k: m[k] for k in SWEEP_METRICS}})
    return rows


def median_table(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians of `SWEEP_METRICS` over workloads per (policy, restart overhead), in first-seen
    order."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["policy"], r["restart_overhead_s"]), []).append(r)
    return [{"policy": p, "restart_overhead_s": o, "workloads": len(g),
             **{k: statistics.median(r[k] for r in g) for k in SWEEP_METRICS}}
            for (p, o), g in groups.items()]
