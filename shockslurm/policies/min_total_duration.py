"""Gavel's min-total-duration (OSSP / makespan), the "min_total_duration" baseline.

For a horizon ``T`` the reference solves a pure feasibility LP (constant objective):
``T_i x_i >= R_i / T`` plus the base constraints, and searches ``T`` by arithmetic-midpoint bisection
over ``[100, 1e6]`` s until the bracket ratio is at most 1.05, widening to ``[1e6, 1e7]``, ... while
nothing is feasible. Only status "optimal" counts as feasible. The returned ``x`` is ECOS's point at
the last feasible ``T`` tried; because the objective is constant that point is centred, well above
the minimal ``R_i/(T T_i)``, and it sets the priorities, so we reproduce the midpoint sequence and
keep ECOS's point instead of using the closed form.

Speed: the problem is built once per call with a ``cp.Parameter`` for ``1/T`` (DPP-compliant) and
re-solved for each bisection step, so cvxpy canonicalises only once.
"""

from __future__ import annotations

import logging
import warnings
from typing import Sequence

import cvxpy as cp
import numpy as np

from ..model import JobView
from . import _lp
from .base import clip_fractions

log = logging.getLogger(__name__)

LOW_S = 100.0
HIGH_S = 1e6
RATIO = 1.05
#: The reference widens without bound (and would loop forever if a job has zero throughput and
#: work left); we give up past this horizon and fall back to the equal GPU-time share.
MAX_HORIZON_S = 1e15


class MinTotalDuration:
    """Feasibility-LP bisection on the makespan ``T``; returns ECOS's point at the smallest T found."""

    name = "min_total_duration"

    def __init__(self) -> None:
        self.last_horizon_s: float | None = None  # diagnostic: the T whose x was returned
        self.last_num_solves: int = 0

    def fractions(self, jobs: Sequence[JobView], gpus: int, now: float) -> dict[int, float]:
        jobs = _lp.sorted_jobs(jobs)
        if not jobs:
            return {}
        ids = [j.job_id for j in jobs]
        sf = _lp.gang_sizes(jobs)
        thr = np.array([float(j.iterations_per_s) for j in jobs])
        rem = np.array([float(j.remaining_iterations) for j in jobs])
        x, constraints = _lp.base_variable(sf, gpus)
        inv_t = cp.Parameter(nonneg=True, value=1.0 / HIGH_S)
        constraints.append(cp.multiply(thr, x) >= cp.multiply(rem, inv_t))
        problem = cp.Problem(cp.Maximize(1), constraints)

        self.last_num_solves = 0

        def feasible(horizon: float) -> np.ndarray | None:
            inv_t.value = 1.0 / horizon
            self.last_num_solves += 1
            try:
                with warnings.catch_warnings():  # "inaccurate" counts as infeasible here anyway
                    warnings.simplefilter("ignore", UserWarning)
                    problem.solve(solver="ECOS")
            except (cp.error.SolverError, ValueError, ArithmeticError) as exc:
                log.warning("%s: ECOS failed at T=%g: %s", self.name, horizon, exc)
                return None
            if problem.status == cp.OPTIMAL and x.value is not None:
                return np.array(x.value, dtype=float)
            return None

        lo, hi, last_hi = LOW_S, HIGH_S, HIGH_S
        best_x: np.ndarray | None = None
        best_t: float | None = None
        while best_x is None:
            while RATIO * lo < hi:
                horizon = (lo + hi) / 2.0
                found = feasible(horizon)
                if found is not None:
                    best_x, best_t, hi = found, horizon, horizon
                else:
                    lo = horizon
            if best_x is not None:
                break
            if last_hi >= MAX_HORIZON_S:
                log.warning("%s: no feasible horizon up to %g s; falling back to the equal "
                            "GPU-time share", self.name, MAX_HORIZON_S)
                self.last_horizon_s = None
                return clip_fractions(ids, _lp.equal_share(sf, gpus))
            hi, lo, last_hi = last_hi * 10.0, last_hi, last_hi * 10.0
        self.last_horizon_s = best_t
        return clip_fractions(ids, best_x)
