"""Lower bounds on what any scheduler can reach on a workload: the yardstick for a fairness or
JCT target (is it reachable at all?).

- `avg_jct_bound`: every job runs alone from its arrival, so no average JCT is below the mean
  exclusive run time.
- `makespan_bound`: no job ends before its arrival plus its exclusive run time, and the work
  (exclusive run time x gang) of the jobs arriving at or after any time `a` cannot end before
  `a` plus that work spread over every GPU. The larger of the two, over every arrival `a`,
  counted from the first arrival (as `sim/metrics.py` counts the makespan).
- `worst_rho_bound`: the smallest worst rho (`sim/metrics.py`'s static form) of the *fluid*
  relaxation: time in slots of `slot_s`, a job may run any fraction of its gang in a slot (never
  faster than alone), GPUs in a slot never exceed the cluster's. Gangs, nodes, rounds and
  switch costs only make a real schedule worse, so no scheduler's worst rho is below it (each
  job's window takes in every slot it touches, so slots only loosen the bound). Found
  by bisection on rho; each step is one linear feasibility program (HiGHS through SciPy):
  job j must receive its exclusive run time of service between its arrival and
  `arrival + rho * contention * exclusive`.
All three hold where a job's exclusive run time is the least it can run: the `profile`
adaptation mode (the default; `bench live` uses it). In the `reference` mode the reference's own
batch-size rules, not the profile, decide a job's pace (a switch rounds the epoch in progress up),
so a job can finish sooner than its exclusive time; `makespan_bound` then takes each job's run
time alone under those rules instead.
They are cheap for live-benchmark sizes (tens of jobs); the LP grows with jobs x slots.
"""

from __future__ import annotations

import math
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


def fluid_feasible(jobs: Sequence[JobSpec], gpus: int, rho: float, slot_s: float = 1.0) -> bool:
    """Whether a fluid schedule finishes every job within `rho` (static form) of its exclusive
    run time on `gpus` GPUs."""
    factor = rho * _contention(jobs, gpus)
    slot_of: list[int] = []        # per variable: its slot, its job and the job's gang
    owner: list[int] = []
    gang: list[int] = []
    for k, job in enumerate(jobs):
        # every slot the job's window touches (a relaxation: the bound stays a bound)
        first = math.floor(job.arrival_s / slot_s + 1e-9)
        last = math.ceil((job.arrival_s + factor * job.exclusive_runtime_s) / slot_s - 1e-9)
        if factor < 1.0 - 1e-9 or (last - first) * slot_s < job.exclusive_runtime_s - 1e-9:
            return False           # faster than alone: impossible
        slot_of.extend(range(first, last))
        owner.extend([k] * (last - first))
        gang.extend([job.gang_size] * (last - first))
    var = len(slot_of)
    slots = max(slot_of) + 1
    cap = coo_matrix((gang, (slot_of, range(var))), shape=(slots, var)).tocsr()
    need = coo_matrix((np.ones(var), (owner, range(var))), shape=(len(jobs), var)).tocsr()
    demand = np.array([j.exclusive_runtime_s / slot_s for j in jobs])
    result = linprog(np.zeros(var), A_ub=cap, b_ub=np.full(slots, float(gpus)), A_eq=need,
                     b_eq=demand, bounds=(0.0, 1.0), method="highs")
    return bool(result.status == 0)


def worst_rho_bound(jobs: Sequence[JobSpec], gpus: int, slot_s: float = 1.0) -> float:
    """The fluid lower bound on the worst rho any schedule reaches (to `RHO_TOLERANCE`)."""
    if not jobs:
        raise ValueError("no jobs")
    if any(j.gang_size > gpus for j in jobs):
        raise ValueError(f"a job asks more than the cluster's {gpus} GPUs")
    low, high = 0.0, 1.0
    while not fluid_feasible(jobs, gpus, high, slot_s):
        low, high = high, high * 2
    while high - low > RHO_TOLERANCE:
        mid = (low + high) / 2
        if fluid_feasible(jobs, gpus, mid, slot_s):
            high = mid
        else:
            low = mid
    return high
