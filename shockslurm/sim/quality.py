"""The quality matrix (`shockslurm bench quality`): reference-like workloads of several sizes and
seeds through Shockwave and every baseline, the baselines both with the reference's Gavel gate and
without it, summarised per size as median ratios against Shockwave.

The runs (`quality_runs`) are simulations; everything after them is pure aggregation over plain
rows (`run_row`, `placement_loss`, `resolve_times`, `ratio_table`, `size_summary`), so it is
tested on hand-made rows.

Definitions:
- **Workload**: `workload.reference_like` with `jobs` jobs at the 120-job trace's load per GPU
  (mean inter-arrival 42 s x 32 / GPUs), seeds 1..S; simulated in the `reference` adaptation
  mode, 120 s rounds, 20 s restart overhead, one pool of GPUs unless `node_gpus` splits it.
- **Gate**: `gate` = the reference's Gavel mechanics (a baseline re-solves at most every 1000 s,
  and a job arriving in between waits for the next re-solve); `nogate` = re-solve every round,
  new jobs start at once (`--resolve-interval 0 --no-idle-new-jobs`). Shockwave and fifo have no
  gate: they run once per workload (gate `-`).
- **Ratio** of makespan, average JCT and worst rho: baseline / Shockwave on the same workload
  (> 1: Shockwave better); **unfair gap**: baseline minus Shockwave unfair fraction (rho > 1.05;
  a ratio would be `inf` where Shockwave's is 0). Both are medians over seeds.
- **Re-solve time**: the policy's time in the rounds where it re-solved (`info["resolved"]`;
  every round for a policy that does not say).
- **Placement loss**: planned GPU-rounds that did not run. Two parts:
  `pack_loss` = 1 - (GPU-rounds `pack` laid out in the window) / (GPU-rounds of the market's
  plan, `sum_j gang_j n_j`, after the planner's capped re-solve), summed over Shockwave's
  re-solves: the work the program plans but no round-by-round layout holds; and `round_loss` = GPUs of the round's plan that did
  not run (trimmed by the policy's work conservation, or left `unplaced` by the round loop's
  placement) / GPUs of the round's plan, summed over rounds (for a baseline: its allocation as
  planned, before placement). `placement_loss = 1 - (1 - pack_loss)(1 - round_loss)`.
- **Layout cut**: `layout_cut` = (GPU-rounds the first solve chose that the priority layout
  could not hold) / (GPU-rounds the first solve chose), summed over Shockwave's re-solves: what
  the aggregated program over-promises and the capped re-solve takes back (before it, this was
  the pack loss).
- **Makespan floor**: `bounds.makespan_bound` of the workload on the case's GPUs with each job's
  run time alone under the matrix's rules (`solo_runtimes`: fifo with a GPU for every gang, so
  each job runs every round from its first; in the `reference` mode the reference's batch-size
  rules, not the profile, set a job's pace). No policy's makespan is below it, so a baseline's
  `makespan_over_floor` is the largest makespan ratio any scheduler could reach against it.
- **Objective drop**: the median over Shockwave's re-solves of
  `(objective - objective_placed) / |objective|`: how much worse the market's objective scores
  with each job's progress cut to the rounds `pack` gave it.
"""

from __future__ import annotations

import math
import statistics
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..model import JobSpec, parse_cluster_shape
from ..policies import PolicySettings
from ..workload.reference import Throughputs, reference_jobs
from ..workload.reference_like import ReferenceLikeConfig, generate_reference_like
from .bounds import makespan_bound
from .run import RoundRecord, SimConfig, SimResult, simulate

SIZES: tuple[tuple[int, int], ...] = ((120, 32), (220, 64), (460, 128), (900, 256),
                                      (2000, 512), (5000, 2048))
"""(jobs, GPUs) of the default matrix."""
REFERENCE_GPUS = 32
REFERENCE_INTERARRIVAL_S = 42.0
"""The 120-job trace's mean inter-arrival time, drawn for 32 GPUs."""
RATIO_METRICS = ("makespan_s", "avg_jct_s", "worst_rho")
SUMMARY_METRICS = (*RATIO_METRICS, "unfair_fraction")
ROW_METRICS = (*SUMMARY_METRICS, "median_rho", "utilization", "sim_wall_s")
Floors = dict[tuple[int, int, int], float]
"""(jobs, GPUs, seed) -> the workload's makespan floor."""
GATES: dict[str, tuple[float, bool]] = {
    "gate": (PolicySettings.min_resolve_interval_s, PolicySettings.idle_unallocated),
    "nogate": (0.0, False)}
"""Gate name -> (minimum re-solve interval s, new jobs idle until the next re-solve)."""
UNGATED = "-"
REFERENCE = "shockwave"

Row = dict[str, Any]


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
    return reference_jobs([d.line for d in drawn], table, f"reference-like {jobs} jobs seed {seed}")


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


# ---------------------------------------------------------------------------- pure aggregation
def resolve_times(rounds: Iterable[RoundRecord]) -> list[float]:
    """Solve times of the rounds where the policy re-solved (all rounds if it never says)."""
    rounds = list(rounds)
    if any("resolved" in r.info for r in rounds):
        return [r.solve_s for r in rounds if r.info.get("resolved")]
    return [r.solve_s for r in rounds]


def placement_loss(rounds: Iterable[RoundRecord], gangs: Mapping[int, int]) -> dict[str, float]:
    """`pack_loss`, `round_loss` and `placement_loss` (module docstring) of one run."""
    planned = packed = 0
    round_planned = round_lost = 0
    for r in rounds:
        info = r.info
        if "planned_gpu_rounds" in info:
            planned += int(info["planned_gpu_rounds"])
            packed += int(info["packed_gpu_rounds"])
        unplaced = sum(gangs[j] for j in info.get("unplaced", ()))
        if "plan_gpus" in info:
            round_planned += int(info["plan_gpus"])
            round_lost += int(info["plan_gpus_lost"]) + unplaced
        else:
            round_planned += r.gpus_used + unplaced
            round_lost += unplaced
    pack = (planned - packed) / planned if planned else 0.0
    trim = round_lost / round_planned if round_planned else 0.0
    return {"pack_loss": pack, "round_loss": trim, "placement_loss": 1 - (1 - pack) * (1 - trim)}


def layout_cut(rounds: Iterable[RoundRecord]) -> float:
    """`layout_cut` (module docstring) of one run; 0 without re-solves that report it."""
    cut = chose = 0
    for r in rounds:
        if "uncapped_gpu_rounds" in r.info:
            cut += int(r.info["layout_cut_gpu_rounds"])
            chose += int(r.info["uncapped_gpu_rounds"])
    return cut / chose if chose else 0.0


def objective_drop(rounds: Iterable[RoundRecord]) -> float:
    """Median over Shockwave's re-solves of how much worse the plan scores as `pack` laid it out
    than as the solver chose it: `(objective - objective_placed) / |objective|` (0 without
    re-solves that report both)."""
    drops = [(float(r.info["objective"]) - float(r.info["objective_placed"]))
             / abs(float(r.info["objective"]))
             for r in rounds if "objective_placed" in r.info
             and math.isfinite(float(r.info["objective"])) and float(r.info["objective"]) != 0]
    return statistics.median(drops) if drops else 0.0


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


def ratio(baseline: float, reference: float) -> float:
    """baseline / reference (> 1: the reference is better); 0/0 = 1, x/0 = inf."""
    if reference == 0:
        return 1.0 if baseline == 0 else math.inf
    return baseline / reference


def ratio_table(rows: Sequence[Row], reference: str = REFERENCE) -> list[Row]:
    """Per (size, policy, gate) other than the reference: the median over seeds of each
    `RATIO_METRICS` ratio against the reference's run on the same workload, of the unfair gap
    (`unfair_fraction_gap`: baseline minus reference), of each `SUMMARY_METRICS` metric itself,
    and of its makespan over the workload's floor. Seeds without a reference run are left out.
    First-seen order."""
    refs = {(r["size"], r["seed"]): r for r in rows if r["policy"] == reference}
    groups: dict[tuple[str, str, str], list[Row]] = {}
    for r in rows:
        if r["policy"] != reference and (r["size"], r["seed"]) in refs:
            groups.setdefault((r["size"], r["policy"], r["gate"]), []).append(r)
    out = []
    for (size, policy, gate), group in groups.items():
        entry: Row = {"size": size, "policy": policy, "gate": gate, "seeds": len(group)}
        for m in RATIO_METRICS:
            entry[f"{m}_ratio"] = statistics.median(
                ratio(r[m], refs[(size, r["seed"])][m]) for r in group)
        entry["unfair_fraction_gap"] = statistics.median(
            r["unfair_fraction"] - refs[(size, r["seed"])]["unfair_fraction"] for r in group)
        for m in SUMMARY_METRICS:
            entry[m] = statistics.median(r[m] for r in group)
        entry["makespan_over_floor"] = statistics.median(r["makespan_over_floor"] for r in group)
        out.append(entry)
    return out


def size_summary(rows: Sequence[Row], reference: str = REFERENCE) -> list[Row]:
    """Per size, the reference policy's medians over seeds of `SUMMARY_METRICS`, of the makespan
    floor and of its makespan over the floor, its median and
    largest re-solve time, its median and largest placement loss, its median layout cut, and its
    fallbacks."""
    groups: dict[str, list[Row]] = {}
    for r in rows:
        if r["policy"] == reference:
            groups.setdefault(r["size"], []).append(r)
    out = []
    for size, group in groups.items():
        out.append({"size": size, "policy": reference, "seeds": len(group),
                    **{m: statistics.median(r[m] for r in group) for m in SUMMARY_METRICS},
                    "makespan_floor_s": statistics.median(r["makespan_floor_s"] for r in group),
                    "makespan_over_floor": statistics.median(
                        r["makespan_over_floor"] for r in group),
                    "resolve_median_s": statistics.median(r["resolve_median_s"] for r in group),
                    "resolve_max_s": max(r["resolve_max_s"] for r in group),
                    "pack_loss": statistics.median(r["pack_loss"] for r in group),
                    "round_loss": statistics.median(r["round_loss"] for r in group),
                    "placement_loss": statistics.median(r["placement_loss"] for r in group),
                    "placement_loss_max": max(r["placement_loss"] for r in group),
                    "objective_drop": statistics.median(r["objective_drop"] for r in group),
                    "layout_cut": statistics.median(r["layout_cut"] for r in group),
                    "fallbacks": sum(r["fallbacks"] for r in group)})
    return out


def frontier_points(rows: Sequence[Row], size: str) -> list[tuple[str, float, float]]:
    """(label, median makespan s, median worst rho) of each policy and gate at `size`."""
    groups: dict[str, list[Row]] = {}
    for r in rows:
        if r["size"] == size:
            label = r["policy"] if r["gate"] == UNGATED else f"{r['policy']} ({r['gate']})"
            groups.setdefault(label, []).append(r)
    return [(label, statistics.median(r["makespan_s"] for r in g),
             statistics.median(r["worst_rho"] for r in g)) for label, g in groups.items()]


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
    def note(i: int, case: Case) -> None:
        if progress is not None:
            progress(f"[{i + 1}/{len(matrix)}] {case.size} seed {case.seed} {case.policy} "
                     f"{case.gate}")

    floors = workload_floors(matrix, table)
    args = [(c, table, floors[(c.jobs, c.gpus, c.seed)]) for c in matrix]
    if workers <= 1:
        rows = []
        for i, arg in enumerate(args):
            note(i, arg[0])
            rows.append(run_case(*arg))
        return rows
    with ProcessPoolExecutor(workers) as pool:
        rows = []
        for i, row in enumerate(pool.map(_run_case_args, args)):
            note(i, matrix[i])
            rows.append(row)
        return rows


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
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
