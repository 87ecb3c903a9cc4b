"""The live benchmark's workload family: the built-in workload's generator over many seeds,
each arm simulated as `bench live --simulate-only` predicts it, and each arm's ratios to a
reference arm (`native` by default) summarised over the seeds.

One seed is one workload; a default chosen on it, or a target stated on it, says little about
the next (the guide: never tune on one workload). The family is what the defaults of the live
side were chosen on; `shockslurm bench live-family` reproduces its figures:

- `parse_seeds`: `10-69`, `10,12,20-25`;
- `seed_row`: one seed's workload (`workload.default_workload`, time-scaled), each arm's
  prediction (`report.predict`: the headline metrics and the worst job), the workload's bounds
  (`report.workload_bounds`) and each arm's ratios to the reference;
- `family_rows`: every seed, in a process pool if asked (the rows are the same either way:
  each simulation is deterministic and independent);
- `summarise`: per arm and metric, the median, geometric mean, smallest and largest ratio over
  the seeds, and how many seeds are at or below a target ratio; the bounds' ratios to the
  reference likewise (what no scheduler goes below, seed by seed);
- `family_table`: that summary as Markdown.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..model import Node
from ..sim.workers import map_ordered
from . import workload as wl
from .repeats import HEADLINE, ratio, ratio_spread
from .report import COLUMNS, predict, workload_bounds

BOUND_KEYS = ("makespan_s", "avg_jct_s", "worst_rho")
"""The metrics `workload_bounds` bounds (its keys)."""

_SEEDS = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def parse_seeds(text: str, most: int | None = None) -> list[int]:
    """`10-69` or `10,12,20-25` -> the seeds in the order given, each once; a ValueError
    naming what is wrong otherwise, also when the ranges hold more than `most` seeds (counted
    before any is listed, so `0-99999999999999` costs nothing)."""
    spans: list[tuple[int, int]] = []
    for part in text.split(","):
        match = _SEEDS.match(part)
        if match is None:
            raise ValueError(f"{part.strip()!r} is not a seed or a range FIRST-LAST")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise ValueError(f"the range {first}-{last} is empty")
        spans.append((first, last))
    if most is not None and sum(last - first + 1 for first, last in spans) > most:
        raise ValueError(f"more than {most:,} seeds")
    seeds: dict[int, None] = {}        # insertion-ordered, each seed once
    for first, last in spans:
        seeds.update(dict.fromkeys(range(first, last + 1)))
    return list(seeds)


@dataclass(frozen=True)
class FamilySettings:
    """What every seed is simulated with (as `bench live --simulate-only` takes it)."""

    nodes: tuple[Node, ...]
    arms: tuple[str, ...]
    reference: str = "native"
    time_scale: float = 0.15
    round_s: float = 15.0
    restart_overhead_s: float = 2.0
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.reference not in self.arms:
            raise ValueError(f"the reference arm {self.reference!r} is not among the arms "
                             f"({', '.join(self.arms)})")


def _worst_job(per_job: object, gangs: Mapping[int, int]) -> dict[str, object]:
    """The job of the largest rho in a prediction's `per_job`, with its gang."""
    rows = [r for r in per_job if isinstance(r, Mapping)] if isinstance(per_job, list) else []
    if not rows:
        return {}
    worst = max(rows, key=lambda r: (float(r["rho"]), -int(r["job"])))
    return {"job": worst["job"], "gang": gangs.get(int(worst["job"])), "rho": worst["rho"]}


def seed_row(seed: int, settings: FamilySettings) -> dict[str, Any]:
    """One seed: each arm's predicted headline metrics and worst job, the bounds, and every
    arm's and the bounds' ratios to the reference arm. A workload the simulator cannot run is
    a ValueError naming the seed."""
    gpus = sum(n.gpus for n in settings.nodes)
    jobs = wl.scale(wl.default_workload(gpus, seed=seed), settings.time_scale)
    gangs = {j.job_id: j.gang_size for j in jobs}
    arms: dict[str, dict[str, Any]] = {}
    for arm in settings.arms:
        try:
            simulated = predict(jobs, arm, settings.nodes, settings.round_s,
                                settings.restart_overhead_s, settings.options.get(arm))
        except ValueError as exc:
            raise ValueError(f"seed {seed}, arm {arm}: {exc}") from None
        arms[arm] = {**{k: simulated.get(k) for k in HEADLINE},
                     "worst_job": _worst_job(simulated.get("per_job"), gangs)}
    bounds = workload_bounds(jobs, gpus)
    ref = arms[settings.reference]
    ratios = {arm: {k: ratio(arms[arm][k], ref[k]) for k in HEADLINE}
              for arm in settings.arms if arm != settings.reference}
    return {"seed": seed, "arms": arms, "bounds": bounds,
            "bound_ratios": {k: ratio(bounds[k], ref[k]) for k in BOUND_KEYS},
            "ratios": ratios}


def _seed_row_args(args: tuple[int, FamilySettings]) -> dict[str, Any]:
    return seed_row(*args)


def family_rows(seeds: Sequence[int], settings: FamilySettings, workers: int = 1,
                progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """`seed_row` for every seed, in `seeds` order; `workers` > 1 simulates seeds in a process
    pool (the same rows)."""
    def note(i: int) -> None:
        if progress is not None:
            progress(f"[{i + 1}/{len(seeds)}] seed {seeds[i]}")

    return map_ordered(_seed_row_args, [(s, settings) for s in seeds], workers, note)


def spread(values: Sequence[float | None], target: float | None = None) -> dict[str, Any]:
    """`repeats.ratio_spread` of the numbers among `values` (median, smallest, largest, `n`),
    their geometric mean (None unless all are positive), and with a `target` how many are at or
    below it (`at_or_below`)."""
    numbers = [v for v in values if v is not None]
    out: dict[str, Any] = {**ratio_spread(numbers), "geomean": None}
    if numbers and all(v > 0 for v in numbers):
        out["geomean"] = round(math.exp(sum(math.log(v) for v in numbers) / len(numbers)), 4)
    if target is not None:
        out["at_or_below"] = sum(v <= target for v in numbers)
    return out


def summarise(rows: Sequence[Mapping[str, Any]], target: float | None = None
              ) -> dict[str, Any]:
    """`ratios`: arm -> metric -> `spread` of its ratios to the reference over the seeds;
    `bound_ratios`: metric -> `spread` of the bounds' ratios (the least any scheduler
    reaches); `worst_job_gangs`: arm -> gang -> on how many seeds its worst job had it."""
    arms = list(dict.fromkeys(a for r in rows for a in r["ratios"]))
    ratios = {arm: {k: spread([r["ratios"][arm][k] for r in rows], target) for k in HEADLINE}
              for arm in arms}
    bounds = {k: spread([r["bound_ratios"][k] for r in rows], target) for k in BOUND_KEYS}
    gangs: dict[str, dict[str, int]] = {}
    for r in rows:
        for arm, numbers in r["arms"].items():
            gang = str(numbers["worst_job"].get("gang"))
            mine = gangs.setdefault(arm, {})
            mine[gang] = mine.get(gang, 0) + 1
    return {"seeds": len(rows), "target": target, "ratios": ratios, "bound_ratios": bounds,
            "worst_job_gangs": {a: dict(sorted(g.items(), key=lambda kv: kv[0]))
                                for a, g in gangs.items()}}


def _cell(s: Mapping[str, Any] | None) -> str:
    if s is None or s.get("median") is None:
        return "-"
    mean = "-" if s.get("geomean") is None else f"{s['geomean']:.3f}"
    return f"{s['median']:.3f} / {mean} ({s['min']:.3f}-{s['max']:.3f})"


def _count(s: Mapping[str, Any] | None) -> str:
    return "-" if s is None or s.get("at_or_below") is None else f"{s['at_or_below']} of {s['n']}"


def family_table(summary: Mapping[str, Any], reference: str) -> str:
    """Markdown: per arm (and the bounds) each metric's ratio to `reference` over the seeds,
    median / geometric mean (smallest-largest); with a target, a second table of how many
    seeds are at or below it."""
    labels = " | ".join(label for _, label, _ in COLUMNS)
    rule = "|---|" + "---|" * len(COLUMNS)
    arms, bounds = summary["ratios"], summary["bound_ratios"]
    rows = [f"| ratio to {reference} over {summary['seeds']} seeds: median / geometric mean "
            f"(min-max) | {labels} |", rule]
    rows += [f"| {arm} | " + " | ".join(_cell(m[k]) for k in HEADLINE) + " |"
             for arm, m in arms.items()]
    rows.append("| bound (no scheduler below) | "
                + " | ".join(_cell(bounds.get(k)) for k in HEADLINE) + " |")
    if summary.get("target") is None:
        return "\n".join(rows)
    rows += ["", f"| seeds at or below {summary['target']:g}x {reference} | {labels} |", rule]
    rows += [f"| {arm} | " + " | ".join(_count(m[k]) for k in HEADLINE) + " |"
             for arm, m in arms.items()]
    rows.append("| bound (no scheduler below) | "
                + " | ".join(_count(bounds.get(k)) for k in HEADLINE) + " |")
    return "\n".join(rows)
