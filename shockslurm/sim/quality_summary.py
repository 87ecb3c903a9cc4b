"""What the quality matrix (`sim.quality`) measures of each run and how it sums the runs up:
pure functions of round records and plain rows, tested on hand-made ones.

Definitions:
- **Ratio** of makespan, average JCT and worst rho: baseline / Shockwave on the same workload
  (> 1: Shockwave better); **unfair gap**: baseline minus Shockwave unfair fraction (rho > 1.05;
  a ratio would be `inf` where Shockwave's is 0). Both are medians over seeds.
- **Re-solve time**: the policy's time in the rounds where it re-solved (`info["resolved"]`;
  every round for a policy that does not say).
- **Placement loss**: planned GPU-rounds that did not run. Two parts:
  `pack_loss` = 1 - (GPU-rounds `pack` laid out in the window) / (GPU-rounds of the market's
  plan, `sum_j gang_j n_j`, after the planner's capped re-solve), summed over Shockwave's
  re-solves: the work the program plans but no round-by-round layout holds; and `round_loss` =
  GPUs of the round's plan that did not run (trimmed by the policy's work conservation, or left
  `unplaced` by the round loop's placement) / GPUs of the round's plan, summed over rounds (for
  a baseline: its allocation as planned, before placement). `placement_loss = 1 - (1 - pack_loss)(1 - round_loss)`.
- **Layout cut**: `layout_cut` = (GPU-rounds the first solve chose that the priority layout
  could not hold) / (GPU-rounds the first solve chose), summed over Shockwave's re-solves: what
  the aggregated program over-promises and the capped re-solve takes back (before it, this was
  the pack loss).
- **Objective drop**: the median over Shockwave's re-solves of
  `(objective - objective_placed) / |objective|`: how much worse the market's objective scores
  with each job's progress cut to the rounds `pack` gave it.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Iterable, Mapping, Sequence

from .run import RoundRecord

RATIO_METRICS = ("makespan_s", "avg_jct_s", "worst_rho")
SUMMARY_METRICS = (*RATIO_METRICS, "unfair_fraction")
UNGATED = "-"
"""The gate of a policy without a Gavel gate (Shockwave, fifo)."""
REFERENCE = "shockwave"

Row = dict[str, Any]


# ---------------------------------------------------------------------------- one run
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


# ---------------------------------------------------------------------------- across runs
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
