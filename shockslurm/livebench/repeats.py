"""Repeated arms: each arm's medians over its runs, and ratios against the native arm paired by
repeat.

A live arm varies from run to run (the same code gave shockwave a makespan of 337 s in one run
and 367 s in the next): Slurm's start latency, the daemon's poll phase and the machine's load
move a switch by a second or two, and a plan by a round. `bench live --repeat N` runs the arms
N times, interleaved (repeat 1 of every arm, then repeat 2, ...), so that a slow spell of the
machine touches every arm alike; these functions make the verdict from all runs:

- `arm_medians`: per arm, the median over its runs of every number the table shows (the live
  numbers, the simulator's prediction, stops, idle GPU-seconds, switch medians), with the
  smallest and largest run beside the headline metrics (`spread_of_runs`);
- `paired_ratios`: per arm and repeat, the arm's metric over the native arm's metric of the
  same repeat, then their median (and range) over repeats. Pairing takes out what the
  machine's state at that time did to both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import median

from .arms import NATIVE
from .report import COLUMNS

HEADLINE = tuple(key for key, _, _ in COLUMNS)
"""The metrics of an arm's run that get medians, ranges and paired ratios (the table's)."""
COUNTS = ("stops", "released_wait_gpu_s", "released_wait_share")
SPREADS = ("switch_usr1_to_successor_running_s", "switch_usr1_to_exit_s",
           "release_to_running_s")


def number(value: object) -> float | None:
    """`value` as a float when it is a number (not a bool), else None."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def ratio(value: object, reference: object) -> float | None:
    """`value / reference` when both are numbers and the reference is not 0."""
    mine, theirs = number(value), number(reference)
    return mine / theirs if mine is not None and theirs else None


def ratio_spread(values: Sequence[float]) -> dict[str, float | None]:
    """Median, smallest and largest of `values` (4 decimals; None when there is none), and
    how many there are (`n`)."""
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": round(median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4), "n": len(values)}


def _median_of(values: Sequence[object]) -> float | None:
    """Median of the numbers among `values` (None when there is none)."""
    numbers = [x for x in (number(v) for v in values) if x is not None]
    return round(median(numbers), 4) if numbers else None


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def runs_by_arm(runs: Sequence[Mapping[str, object]]) -> dict[str, list[Mapping[str, object]]]:
    """The runs of each arm, arms in the order they first ran, runs in repeat order."""
    out: dict[str, list[Mapping[str, object]]] = {}
    for run in runs:
        out.setdefault(str(run["arm"]), []).append(run)
    return out


def spread_of_runs(runs: Sequence[Mapping[str, object]], key: str) -> dict[str, float | None]:
    """Median, smallest and largest of `key` over the runs that have it."""
    numbers = [x for x in (number(r.get(key)) for r in runs) if x is not None]
    if not numbers:
        return {"median": None, "min": None, "max": None}
    return {"median": round(median(numbers), 4), "min": min(numbers), "max": max(numbers)}


def arm_medians(runs: Sequence[Mapping[str, object]]) -> list[dict[str, object]]:
    """One entry per arm, shaped like a run (so `report.markdown_table` prints it), every
    number the median over the arm's runs; `runs` says how many, `range` the headline
    metrics' smallest and largest run."""
    out = []
    for arm, mine in runs_by_arm(runs).items():
        entry: dict[str, object] = {"arm": arm, "runs": len(mine)}
        for key in (*HEADLINE, *COUNTS):
            entry[key] = _median_of([r.get(key) for r in mine])
        entry["range"] = {key: spread_of_runs(mine, key) for key in HEADLINE}
        for key in SPREADS:
            spreads = [_mapping(r.get(key)) for r in mine if _mapping(r.get(key))]
            if spreads:
                entry[key] = {"median": _median_of([s.get("median") for s in spreads]),
                              "max": _median_of([s.get("max") for s in spreads])}
        idle = [_mapping(r.get("idle_gpu_s")) for r in mine]
        causes = sorted({c for d in idle for c in d})
        entry["idle_gpu_s"] = {c: _median_of([d.get(c) for d in idle]) for c in causes}
        simulated = [_mapping(r.get("simulated")) for r in mine]
        entry["simulated"] = {key: _median_of([s.get(key) for s in simulated])
                              for key in HEADLINE}
        out.append(entry)
    return out


def paired_ratios(runs: Sequence[Mapping[str, object]], reference: str = NATIVE
                  ) -> dict[str, dict[str, dict[str, float | None]]]:
    """arm -> metric -> median, min and max over repeats of (the arm's run) / (the reference
    arm's run of the same repeat); repeats without both runs, or with a reference of 0, are
    left out. Empty when no run is the reference's."""
    arms = runs_by_arm(runs)
    if reference not in arms:
        return {}
    by_repeat: dict[object, dict[str, Mapping[str, object]]] = {}
    for run in runs:
        by_repeat.setdefault(run.get("repeat", 1), {})[str(run["arm"])] = run
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for arm in (a for a in arms if a != reference):
        per_metric: dict[str, dict[str, float | None]] = {}
        for key in HEADLINE:
            ratios = []
            for pair in by_repeat.values():
                if arm in pair and reference in pair:
                    r = ratio(pair[arm].get(key), pair[reference].get(key))
                    if r is not None:
                        ratios.append(r)
            per_metric[key] = ratio_spread(ratios)
        out[arm] = per_metric
    return out


def ratio_table(ratios: Mapping[str, Mapping[str, Mapping[str, float | None]]],
                reference: str = NATIVE) -> str:
    """Markdown: per arm, each headline metric's median paired ratio against `reference` and
    its range over repeats (< 1: the arm's number is smaller)."""
    head = (f"| arm / {reference}, paired by repeat | "
            + " | ".join(label for _, label, _ in COLUMNS) + " |")
    rows = [head, "|---|" + "---|" * len(HEADLINE)]
    for arm, metrics in ratios.items():
        cells = []
        for key in HEADLINE:
            r = metrics.get(key, {})
            cells.append("-" if r.get("median") is None else
                         f"{r['median']:.3f} ({r['min']:.3f}-{r['max']:.3f})")
        rows.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(rows)
