"""The churn bounds' rules that do not depend on Slurm, shared by the live scheduler
(`live/bounds.py`, which adds the store-backed ones: preemptions per day, failing checkpoints)
and the simulator's live-like rounds (`sim/cluster.py`), so that the simulator keeps running the
jobs the daemon would keep (pure).

- `early_stop_reason`: a running job the plan would stop is kept when it is expected to finish
  within `finish_window_seconds` ("nearly_done") or its current run is younger than
  `min_run_seconds` ("min_run"). Defaults: two rounds and 1.5 rounds (`ChurnLimits.for_round`).
- `bound_run`: keeping jobs running leaves fewer GPUs for the plan's starts: planned jobs that do
  not hold GPUs are dropped, lowest priority first (the latest first in `order`), until what
  runs fits the capacity. Running planned jobs are never dropped.
- `idle_stops`: a running job the plan stops is kept where it runs when no job of the round
  takes its GPUs (its successor was dropped above, or does not fit the nodes): the stop would
  cost it a restart and leave its GPUs idle until the next round. Measured live before this
  rule: stops whose GPUs then idled a whole round made the longest switches (15.5 s, against a
  median of 2.6 s).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection, Mapping, Sequence

from .model import NodeShares
from .plan_on_nodes import fit_on_nodes
from .policies import PolicySettings

MIN_RUN_ROUNDS = 1.5
# A job with less than two rounds left that is stopped waits at least until the next plan runs
# it and pays a restart, while its GPUs go to a successor for less than two rounds: keeping it
# to its end is the shortest-remaining-time choice. Chosen on three workload families with
# live-like rounds (README "Live-like rounds"): against half a round, the median average JCT
# fell for Shockwave and max_min_fairness on each, fifo unchanged.
FINISH_WINDOW_ROUNDS = 2.0


@dataclass(frozen=True)
class ChurnLimits:
    """How often the daemon may stop one job (0 disables a bound).

    `finish_window_seconds`: a running job expected to finish within this many seconds (its
    remaining exclusive run time, from its reports or its declared spec) is not stopped: the
    stop would free its GPUs for a short time only, cost it a restart and a wait for its next
    turn, and could race its own end (a job that ends in the same second as its USR1 cannot be
    told apart from one that checkpointed and exited on it, so it would be requeued and run
    again). Default two rounds (`FINISH_WINDOW_ROUNDS`)."""

    min_run_seconds: float = MIN_RUN_ROUNDS * PolicySettings.round_s
    max_preemptions_per_day: int = 24
    max_stops_without_checkpoint: int = 3
    finish_window_seconds: float = FINISH_WINDOW_ROUNDS * PolicySettings.round_s

    @classmethod
    def for_round(cls, round_s: float, **overrides: float | None) -> "ChurnLimits":
        """The defaults for rounds of `round_s` (min run 1.5 rounds, finish window two
        rounds), with overrides (None: the default)."""
        values: dict[str, Any] = {"min_run_seconds": MIN_RUN_ROUNDS * round_s,
                                  "finish_window_seconds": FINISH_WINDOW_ROUNDS * round_s}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def early_stop_reason(limits: ChurnLimits, ran_s: float | None,
                      remaining_s: float | None) -> tuple[str, str] | None:
    """("nearly_done" | "min_run", explanation) when a job that has run `ran_s` seconds of its
    current run, with `remaining_s` exclusive seconds of work left, must not be stopped now
    (None: unknown)."""
    if limits.finish_window_seconds > 0 and remaining_s is not None \
            and remaining_s < limits.finish_window_seconds:
        return "nearly_done", (f"expected to finish in {remaining_s:.0f} s < finish window "
                               f"{limits.finish_window_seconds:g} s")
    if limits.min_run_seconds > 0 and ran_s is not None and ran_s < limits.min_run_seconds:
        return "min_run", f"running {ran_s:.0f} s < min_run_seconds {limits.min_run_seconds:g}"
    return None


def bound_run(run: Collection[int], running: Collection[int], keep: Collection[int],
              gpus: Mapping[int, int], order: Sequence[int],
              capacity: int) -> tuple[frozenset[int], tuple[int, ...]]:
    """The plan's run set with the running jobs `keep` added; then the planned jobs of `order`
    (those that may be dropped, highest priority first) are taken while they fit in `capacity`
    GPUs beside the `running` ones, and the others dropped. Returns (run set, dropped ids)."""
    out = set(run) | set(keep)
    if not keep:
        return frozenset(out), ()
    used = sum(gpus[j] for j in out if j in running)
    dropped = []
    for j in order:
        if j not in out or j in running:
            continue
        if used + gpus[j] <= capacity:
            used += gpus[j]
        else:
            dropped.append(j)
    return frozenset(out - set(dropped)), tuple(sorted(dropped))


def idle_stops(stopping: Sequence[int], where: Mapping[int, NodeShares],
               free: Mapping[str, int]) -> tuple[int, ...]:
    """The jobs of `stopping` (in that order) that can keep running where they run (`where`)
    in the GPUs left `free` per node once every job of the round has its own; each job kept
    takes its GPUs before the next is tried. A job without a known place is not kept."""
    placed = [j for j in stopping if where.get(j)]
    misfit = set(fit_on_nodes(placed, where, free))
    return tuple(j for j in placed if j not in misfit)
