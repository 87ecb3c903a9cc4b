"""The simulator's prediction for an arm, and the side-by-side table.

The prediction runs `sim.run.simulate` on the same time-scaled workload (real seconds) and the
live cluster's node shape:
- a policy arm: that policy, rounds of the arm's `round_seconds`, restart overhead = the arm's
  measured median switch (USR1 -> successor RUNNING; USR1 -> exit when no successor was seen),
  the Gavel gate off as in the daemon's configuration, and the daemon's event-driven rounds
  (`fill_on_completion`: a round starts when a completion frees GPUs while a job waits, or an
  arrival fits the idle GPUs), and the policy knowing each job as the daemon does
  (`declared_profile`: what `shocksub` declares, every epoch at the initial batch size and the
  first epoch's duration, not the workload's per-epoch profile; the jobs still run by it);
- both: a job that runs on into the next round keeps its part-done iteration
  (`keep_partial_iterations`), as a live job does, so that a workload replayed slowly (long
  iterations next to the native arm's 1 s rounds) is predicted, not refused;
- `native`: the simulator's Slurm-like FIFO with EASY backfill (`fifo`), in `NATIVE_ROUND_S`
  rounds (Slurm starts a job within about a second of its resources freeing) and no restart
  overhead (nothing is ever stopped).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..model import JobSpec, Node
from ..policies import PolicySettings
from ..sim.bounds import avg_jct_bound, makespan_bound, worst_rho_bound
from ..sim.metrics import static_rho
from ..sim.run import SimConfig, simulate

NATIVE_ROUND_S = 1.0
COLUMNS = (("makespan_s", "makespan s", "{:.0f}"), ("avg_jct_s", "avg JCT s", "{:.0f}"),
           ("p99_jct_s", "p99 JCT s", "{:.0f}"), ("worst_rho", "worst rho", "{:.2f}"),
           ("median_rho", "median rho", "{:.2f}"), ("utilization", "utilisation", "{:.2f}"))


def measured_switch_s(arm: Mapping[str, object]) -> float:
    """The arm's median switch cost in seconds: USR1 -> the successor RUNNING (else -> the
    stopped job's exit); for an arm that stopped nothing, Slurm's own start latency (release ->
    RUNNING), which every start pays live and the simulator charges as the restart overhead;
    0 when none was measured."""
    for key in ("switch_usr1_to_successor_running_s", "switch_usr1_to_exit_s",
                "release_to_running_s"):
        value = arm.get(key)
        if isinstance(value, Mapping) and value.get("median") is not None:
            return float(str(value["median"]))
    return 0.0


def predict(jobs: Sequence[JobSpec], arm: str, nodes: tuple[Node, ...], round_s: float,
            restart_overhead_s: float, options: Mapping[str, Any] | None = None
            ) -> dict[str, object]:
    """The simulator's numbers for `arm` (with the policy's `options`) on `jobs` (real seconds)
    and `nodes`; `per_job`: each job's completion, JCT and rho (beside the live arm's
    `per_job`, `timeline.job_rows`)."""
    native = arm == "native"
    settings = PolicySettings(round_s=NATIVE_ROUND_S if native else round_s,
                              min_resolve_interval_s=0.0, idle_unallocated=False)
    config = SimConfig.for_nodes(nodes, restart_overhead_s=0.0 if native else restart_overhead_s,
                                 settings=settings, fill_on_completion=not native,
                                 declared_profile=not native, keep_partial_iterations=True)
    result = simulate(jobs, "fifo" if native else arm, config,
                      policy_options=None if native else (options or None))
    out: dict[str, object] = {k: round(v, 4) if isinstance(v, float) else v
                              for k, v in result.metrics.as_dict().items()}
    out.update(policy=result.policy, round_s=config.round_s,
               restart_overhead_s=config.restart_overhead_s,
               declared_profile=config.declared_profile,
               keep_partial_iterations=config.keep_partial_iterations)
    outcomes = sorted(result.outcomes, key=lambda o: o.job_id)
    rho = static_rho(outcomes, config.gpus, len(jobs))
    out["per_job"] = [{"job": o.job_id, "completion_s": round(o.completion_s, 2),
                       "jct_s": round(o.jct_s, 2), "rho": round(float(r), 4)}
                      for o, r in zip(outcomes, rho)]
    return out


def workload_bounds(jobs: Sequence[JobSpec], gpus: int) -> dict[str, float]:
    """What no scheduler beats on `jobs` (`sim.bounds`) on `gpus` GPUs, in the jobs' seconds:
    the fluid relaxation's worst rho, the mean exclusive run time, the makespan floor."""
    return {"worst_rho": round(worst_rho_bound(jobs, gpus), 3),
            "avg_jct_s": round(avg_jct_bound(jobs), 1),
            "makespan_s": round(makespan_bound(jobs, gpus), 1)}


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def _cell(value: object, fmt: str) -> str:
    return fmt.format(value) if isinstance(value, (int, float)) else "-"


def _spread_cell(value: object) -> str:
    if isinstance(value, Mapping) and value.get("median") is not None:
        return f"{value['median']:.1f} / {value['max']:.1f}"
    return "-"


def markdown_table(arms: Sequence[Mapping[str, object]]) -> str:
    """Live vs simulated per arm, one column per arm ("live (sim)")."""
    head = "| | " + " | ".join(str(a["arm"]) for a in arms) + " |"
    rule = "|---|" + "---|" * len(arms)
    rows = [head, rule]
    for key, label, fmt in COLUMNS:
        cells = []
        for a in arms:
            sim = _mapping(a.get("simulated"))
            cells.append(f"{_cell(a.get(key), fmt)} ({_cell(sim.get(key), fmt)})")
        rows.append(f"| {label}, live (sim) | " + " | ".join(cells) + " |")
    rows.append("| stops | " + " | ".join(_cell(a.get("stops"), "{:g}") for a in arms) + " |")
    rows.append("| switch USR1 -> successor RUNNING s, median / max | " + " | ".join(
        _spread_cell(a.get("switch_usr1_to_successor_running_s")) for a in arms) + " |")
    rows.append("| USR1 -> job exited s, median / max | " + " | ".join(
        _spread_cell(a.get("switch_usr1_to_exit_s")) for a in arms) + " |")
    rows.append("| release -> RUNNING s, median / max | " + " | ".join(
        _spread_cell(a.get("release_to_running_s")) for a in arms) + " |")
    rows.append("| released job waiting to run, GPU-s (share of capacity) | " + " | ".join(
        f"{_cell(a.get('released_wait_gpu_s'), '{:.0f}')} "
        f"({_cell(a.get('released_wait_share'), '{:.1%}')})" for a in arms) + " |")
    for cause in ("pending_fits", "pending_too_big"):
        rows.append(f"| idle GPU-s, {cause.replace('_', ' ')} | " + " | ".join(
            _cell(_mapping(a.get("idle_gpu_s")).get(cause), "{:.0f}")
            for a in arms) + " |")
    return "\n".join(rows)
