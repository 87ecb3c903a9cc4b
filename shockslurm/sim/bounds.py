"""Lower bounds on what any scheduler can reach on a workload: the yardstick for a fairness or
JCT target (is it reachable at all?).

- `avg_jct_bound`: every job runs alone from its arrival, so no average JCT is below the mean
  exclusive run time.
- `makespan_bound`: no job ends before its arrival plus its exclusive run time, and the work
  (exclusive run time x gang) of the jobs arriving at or after any time `a` cannot end before
  `a` plus that work spread over every GPU. The larger of the two, over every arrival `a`,
  counted from the first arrival (as `sim/metrics.py` counts the makespan).
- `worst_rho_bound`: the smallest worst rho (`sim/metrics.py`'s static form) of the *fluid*
  relaxation: a job may run any fraction of its gang at any time (never faster than alone), the
  GPUs in use never exceed the cluster's. Gangs, nodes, rounds and switch costs only make a real
  schedule worse, so no scheduler's worst rho is below it. Found by bisection on rho; each step
  is one linear feasibility program (HiGHS through SciPy): job j must receive its exclusive run
  time of service between its arrival and its deadline `arrival + rho * contention *
  exclusive`. Time is cut at every arrival and deadline: between two cuts the same jobs may
  run, so a fluid schedule exists exactly when each interval's service fits its GPUs (no job
  more than the interval's length, all of them at most GPUs x length). The program has at most
  jobs x 2 jobs variables, whatever the workload's time scale.
All three hold where a job's exclusive run time is the least it can run: the `profile`
adaptation mode (the default; `bench live` uses it). In the `reference` mode the reference's own
batch-size rules, not the profile, decide a job's pace (a switch rounds the epoch in progress up),
so a job can finish sooner than its exclusive time; `makespan_bound` then takes each job's run
time alone under those rules instead.
They are cheap for live-benchmark sizes (tens of jobs): the program grows with jobs squared.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from ..model import JobSpec

RHO_TOLERANCE = 0.002


def avg_jct_bound(jobs: Sequence[JobSpec]) -> float:
    """No schedule's average JCT is below the mean exclusive run time."""
    if not jobs:
        raise ValueError("no jobs")
    return float(np.mean([j.exclusive_runtime_s for j in jobs]))


def makespan_bound(jobs: Sequence[JobSpec], gpus: int,
                   runtimes: Mapping[int, float] | None = None) -> float:
    """No schedule's makespan is below this (module docstring). `runtimes` (job id -> s), where
    given, replaces each job's exclusive run time by the least it runs under other rules (the
    `reference` mode: `sim.quality.solo_runtimes`)."""
    if not jobs:
        raise ValueError("no jobs")
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    least = {j.job_id: j.exclusive_runtime_s for j in jobs} if runtimes is None else runtimes
    bound = max(j.arrival_s + least[j.job_id] for j in jobs)
    work_after = 0.0
    for j in sorted(jobs, key=lambda j: j.arrival_s, reverse=True):
        work_after += least[j.job_id] * j.gang_size
        bound = max(bound, j.arrival_s + work_after / gpus)
    return float(bound - min(j.arrival_s for j in jobs))


def _contention(jobs: Sequence[JobSpec], gpus: int) -> float:
    return max(1.0, len(jobs) / gpus)


def fluid_feasible(jobs: Sequence[JobSpec], gpus: int, rho: float) -> bool:
    """Whether a fluid schedule finishes every job within `rho` (static form) of its exclusive
    run time on `gpus` GPUs."""
    factor = rho * _contention(jobs, gpus)
    if factor < 1.0 - 1e-9:
        return False               # faster than alone: impossible
    arrivals = np.array([j.arrival_s for j in jobs], dtype=float)
    exclusive = np.array([j.exclusive_runtime_s for j in jobs], dtype=float)
    deadlines = arrivals + max(factor, 1.0) * exclusive
    cuts = np.unique(np.concatenate([arrivals, deadlines]))
    length = np.diff(cuts)
    first = np.searchsorted(cuts, arrivals)           # exact: the cuts hold these very values
    last = np.searchsorted(cuts, deadlines)
    interval = np.concatenate([np.arange(f, e) for f, e in zip(first, last)])
    owner = np.repeat(np.arange(len(jobs)), last - first)
    gang = np.array([j.gang_size for j in jobs], dtype=float)[owner]
    var = np.arange(len(interval))
    cap = coo_matrix((gang, (interval, var)), shape=(len(length), len(var))).tocsr()
    need = coo_matrix((np.ones(len(var)), (owner, var)), shape=(len(jobs), len(var))).tocsr()
    # service in seconds of the whole gang: at most the interval's length (never faster than
    # alone), the GPUs' seconds in the interval shared by all
    result = linprog(np.zeros(len(var)), A_ub=cap, b_ub=float(gpus) * length, A_eq=need,
                     b_eq=exclusive, bounds=np.column_stack([np.zeros(len(var)),
                                                             length[interval]]),
                     method="highs")
    return bool(result.status == 0)


def worst_rho_bound(jobs: Sequence[JobSpec], gpus: int) -> float:
    """The fluid lower bound on the worst rho any schedule reaches (to `RHO_TOLERANCE`)."""
    if not jobs:
        raise ValueError("no jobs")
    if any(j.gang_size > gpus for j in jobs):
        raise ValueError(f"a job asks more than the cluster's {gpus} GPUs")
    low, high = 0.0, 1.0
    while not fluid_feasible(jobs, gpus, high):
        low, high = high, high * 2
    while high - low > RHO_TOLERANCE:
        mid = (low + high) / 2
        if fluid_feasible(jobs, gpus, mid):
            high = mid
        else:
            low = mid
    return high
