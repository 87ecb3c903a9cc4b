"""The quality matrix (`shockslurm bench quality`): reference-like workloads of several sizes and
seeds through Shockwave and every baseline, the baselines both with the reference's Gavel gate and
without it, summarised per size as median ratios against Shockwave.

The runs (`quality_runs`) are simulations, each summarised as a plain row (`run_row`); what is
measured of a run and how rows are aggregated is `sim.quality_summary`'s (pure, tested on
hand-made rows).

Definitions:
- **Workload**: `workload.reference_like` with `jobs` jobs at the 120-job trace's load per GPU
  (mean inter-arrival 42 s x 32 / GPUs), seeds 1..S; simulated in the `reference` adaptation
  mode, 120 s rounds, 20 s restart overhead, one pool of GPUs unless `node_gpus` splits it.
- **Gate**: `gate` = the reference's Gavel mechanics (a baseline re-solves at most every 1000 s,
  and a job arriving in between waits for the next re-solve); `nogate` = re-solve every round,
  new jobs start at once (`--resolve-interval 0 --no-idle-new-jobs`). Shockwave and fifo have no
  gate: they run once per workload (gate `-`).
- **Makespan floor**: `bounds.makespan_bound` of the workload on the case's GPUs with each job's
  run time alone under the matrix's rules (`solo_runtimes`: fifo with a GPU for every gang, so
  each job runs every round from its first; in the `reference` mode the reference's batch-size
  rules, not the profile, set a job's pace). No policy's makespan is below it, so a baseline's
  `makespan_over_floor` is the largest makespan ratio any scheduler could reach against it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..atomic import write_file
from ..model import JobSpec, parse_cluster_shape
from ..policies import PolicySettings
from ..workload.reference import Throughputs, reference_jobs
from ..workload.reference_like import ReferenceLikeConfig, generate_reference_like
from .bounds import makespan_bound
from .reference_profiles import with_reference_profiles
from .quality_summary import (REFERENCE, SUMMARY_METRICS, UNGATED, Row, frontier_points,
                              layout_cut, objective_drop, placement_loss, resolve_times)
from .run import SimConfig, SimResult, simulate
from .workers import map_ordered

SIZES: tuple[tuple[int, int], ...] = ((120, 32), (220, 64), (460, 128), (900, 256),
                                      (2000, 512), (5000, 2048))
"""(jobs, GPUs) of the default matrix."""
REFERENCE_GPUS = 32
REFERENCE_INTERARRIVAL_S = 42.0
"""The 120-job trace's mean inter-arrival time, drawn for 32 GPUs."""
ROW_METRICS = (*SUMMARY_METRICS, "median_rho", "utilization", "sim_wall_s")
Floors = dict[tuple[int, int, int], float]
"""(jobs, GPUs, seed) -> the workload's makespan floor."""
GATES: dict[str, tuple[float, bool]] = {
    "gate": (PolicySettings.min_resolve_interval_s, PolicySettings.idle_unallocated),
    "nogate": (0.0, False)}
"""Gate name -> (minimum re-solve interval s, new jobs idle until the next re-solve)."""


@dataclass(frozen=True)
class Case:
    """One simulation of the matrix."""

    jobs: int
    gpus: int
    seed: int
    policy: str
    gate: str               # a key of GATES, or UNGATED
    node_gpus: int = 0      # 0: one pool
    options: tuple[tuple[str, Any], ...] = ()   # the policy's options (key, value), sorted

    @property
    def size(self) -> str:
        return size_label(self.jobs, self.gpus)


def size_label(jobs: int, gpus: int) -> str:
    return f"{jobs}/{gpus}"


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """`120/32,220/64` -> [(120, 32), (220, 64)]; ValueError naming the bad entry."""
    sizes = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        jobs, sep, gpus = part.partition("/")
        if not sep or not jobs.strip().isdigit() or not gpus.strip().isdigit() \
                or int(jobs) < 1 or int(gpus) < 1:
            raise ValueError(f"size {part!r}: expected JOBS/GPUS with positive integers, "
                             f"e.g. 220/64")
        sizes.append((int(jobs), int(gpus)))
    if not sizes:
        raise ValueError("no sizes given")
    return sizes


def cases(sizes: Sequence[tuple[int, int]], seeds: Sequence[int], policies: Sequence[str],
          gated: Callable[[str], bool], node_gpus: int = 0,
          options: Mapping[str, Mapping[str, Any]] | None = None) -> list[Case]:
    """Every simulation of the matrix, size by size, seed by seed; a policy with a Gavel gate
    (`gated`) runs with and without it, the others once; `options` (policy -> its options)
    go with each of the policy's cases."""
    out = []
    for jobs, gpus in sizes:
        for seed in seeds:
            for policy in policies:
                gates = tuple(GATES) if gated(policy) else (UNGATED,)
                given = tuple(sorted((options or {}).get(policy, {}).items()))
                out += [Case(jobs, gpus, seed, policy, g, node_gpus, given) for g in gates]
    return out


def workload(jobs: int, gpus: int, seed: int, table: Throughputs) -> list[JobSpec]:
    """The reference-like workload of one size and seed, at the 120-job trace's load per GPU."""
    gap_s = REFERENCE_INTERARRIVAL_S * REFERENCE_GPUS / gpus
    config = ReferenceLikeConfig(jobs=jobs, seed=seed, mean_interarrival_s=gap_s)
    drawn = generate_reference_like(config, table)
    return with_reference_profiles(reference_jobs([d.line for d in drawn], table,
                                                  f"reference-like {jobs} jobs seed {seed}"))


def sim_config(case: Case) -> SimConfig:
    interval, idle = GATES.get(case.gate, GATES["gate"])
    common: dict[str, Any] = {"adaptation": "reference", "settings": PolicySettings(
        min_resolve_interval_s=interval, idle_unallocated=idle)}
    if case.node_gpus and case.gpus > case.node_gpus:
        if case.gpus % case.node_gpus:
            raise ValueError(f"{case.gpus} GPUs do not split into nodes of {case.node_gpus}")
        shape = f"{case.gpus // case.node_gpus}x{case.node_gpus}"
        return SimConfig.for_nodes(parse_cluster_shape(shape), **common)
    return SimConfig(gpus=case.gpus, **common)


def run_row(case: Case, result: SimResult, gangs: Mapping[int, int], floor_s: float) -> Row:
    """One simulation as a plain row: the case, its metrics, the workload's makespan floor and
    how far above it the run ended, re-solve times, placement loss."""
    metrics = result.as_dict()
    times = resolve_times(result.rounds)
    fallbacks = sum(1 for r in result.rounds
                    if str(r.info.get("status", "")).startswith("fallback"))
    return {"size": case.size, "jobs": case.jobs, "gpus": case.gpus, "seed": case.seed,
            "policy": case.policy, "gate": case.gate,
            **{k: metrics[k] for k in ROW_METRICS},
            "makespan_floor_s": floor_s, "makespan_over_floor": metrics["makespan_s"] / floor_s,
            "resolves": len(times),
            "resolve_median_s": statistics.median(times) if times else 0.0,
            "resolve_max_s": max(times, default=0.0),
            "fallbacks": fallbacks,
            "objective_drop": objective_drop(result.rounds),
            "layout_cut": layout_cut(result.rounds),
            **placement_loss(result.rounds, gangs)}


# ---------------------------------------------------------------------------- running it
def solo_runtimes(jobs: Sequence[JobSpec], case: Case) -> dict[int, float]:
    """Each job's run time alone under the case's simulator rules: fifo with a GPU for every gang
    (one pool), so every job runs every round from its first; from that round's start to the
    job's completion (its start's restart charge included)."""
    alone = replace(case, gpus=sum(j.gang_size for j in jobs), policy="fifo", gate=UNGATED,
                    node_gpus=0, options=())
    result = simulate(jobs, "fifo", sim_config(alone))
    first: dict[int, float] = {}
    for r in result.rounds:
        for job_id in r.run:
            first.setdefault(job_id, r.start_s)
    return {o.job_id: o.completion_s - first[o.job_id] for o in result.outcomes}


def makespan_floor(jobs: Sequence[JobSpec], case: Case) -> float:
    """The makespan no policy beats on the case's workload and GPUs (module docstring), taking a
    job to run fastest when it runs every round."""
    return makespan_bound(jobs, case.gpus, solo_runtimes(jobs, case))


def workload_floors(matrix: Sequence[Case], table: Throughputs) -> Floors:
    """The makespan floor of every workload in `matrix` (nodes do not lower it: one pool)."""
    floors: Floors = {}
    for case in matrix:
        key = (case.jobs, case.gpus, case.seed)
        if key not in floors:
            floors[key] = makespan_floor(workload(case.jobs, case.gpus, case.seed, table), case)
    return floors


def run_case(case: Case, table: Throughputs, floor_s: float) -> Row:
    """Simulate one case (deterministic: the same case gives the same row but for times)."""
    jobs = workload(case.jobs, case.gpus, case.seed, table)
    result = simulate(jobs, case.policy, sim_config(case), policy_options=dict(case.options))
    return run_row(case, result, {j.job_id: j.gang_size for j in jobs}, floor_s)


def _run_case_args(args: tuple[Case, Throughputs, float]) -> Row:
    return run_case(*args)


def quality_runs(matrix: Sequence[Case], table: Throughputs, workers: int = 1,
                 progress: Callable[[str], None] | None = None) -> list[Row]:
    """One row per case, in `matrix` order. `workers` > 1 runs cases in a process pool: the
    rows are the same (each simulation is deterministic and independent) except the times."""
    def note(i: int) -> None:
        if progress is not None:
            case = matrix[i]
            progress(f"[{i + 1}/{len(matrix)}] {case.size} seed {case.seed} {case.policy} "
                     f"{case.gate}")

    floors = workload_floors(matrix, table)
    args = [(c, table, floors[(c.jobs, c.gpus, c.seed)]) for c in matrix]
    return map_ordered(_run_case_args, args, workers, note)


def write_frontier_plots(rows: Sequence[Row], out_dir: Path) -> list[Path]:
    """One PNG per size: median makespan (x) against median worst rho (y) of every policy and
    gate; Shockwave in red, the median makespan floor as a dashed line. Returns the files
    written."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for size in dict.fromkeys(r["size"] for r in rows):
        fig, ax = plt.subplots(figsize=(7, 5))
        for label, makespan, rho in frontier_points(rows, size):
            mine = label == REFERENCE
            ax.scatter([makespan / 3600], [rho], color="tab:red" if mine else
                       ("tab:blue" if "(nogate)" in label else "tab:gray"),
                       marker="*" if mine else "o", s=160 if mine else 40, zorder=3)
            ax.annotate(label, (makespan / 3600, rho), fontsize=7, xytext=(4, 3),
                        textcoords="offset points")
        floors = [r["makespan_floor_s"] for r in rows
                  if r["size"] == size and r["policy"] == REFERENCE and "makespan_floor_s" in r]
        if floors:
            ax.axvline(statistics.median(floors) / 3600, color="tab:green", linestyle="--",
                       label="makespan floor (median)")
            ax.legend(loc="upper right", fontsize=7)
        ax.set_xlabel("median makespan (h)")
        ax.set_ylabel("median worst rho")
        ax.set_title(f"{size} jobs/GPUs: lower left is better")
        ax.grid(alpha=0.3)
        path = out_dir / f"quality-{size.replace('/', 'x')}.png"
        fig.tight_layout()
        try:                  # whole or not at all: an older plot stays if this one fails
            write_file(path, lambda fh: fig.savefig(fh, format="png", dpi=110), within=out_dir)
        finally:
            plt.close(fig)
        written.append(path)
    return written
