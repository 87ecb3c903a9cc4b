"""Gavel's max-min fairness (LAS), the "max_min_fairness" baseline.

The reference wrapper replaces every throughput by 1.0, so its proportional throughput is 1 and the
LP reduces to ``max t  s.t.  t <= sf_i x_i / w_i,  sum sf_i x_i <= G,  0 <= x <= 1``: an equal share
of *GPU-time*, i.e. ``x_i = (G/m)/sf_i`` when contended. Uncontended, the optimum is degenerate and
the reference returns ECOS's interior (analytic-centre-like) point, which does not fill the cluster
and whose multi-GPU values set the scheduler's priorities, so we solve the same LP with ECOS rather
than write down a vertex.
"""

from __future__ import annotations

from typing import Sequence

import cvxpy as cp
import numpy as np

from ..model import JobView
from . import _lp
from .base import clip_fractions


class MaxMinFairness:
    """Weighted max-min fair GPU-time shares (priority weights divide the share)."""

    name = "max_min_fairness"

    def fractions(self, jobs: Sequence[JobView], gpus: int, now: float) -> dict[int, float]:
        jobs = _lp.sorted_jobs(jobs)
        if not jobs:
            return {}
        sf = _lp.gang_sizes(jobs)
        inv_w = np.array([1.0 / j.priority_weight for j in jobs])
        coef = inv_w * sf  # T = 1 and proportional throughput = 1 after the wrapper
        x, constraints = _lp.base_variable(sf, gpus)
        problem = cp.Problem(cp.Maximize(cp.min(cp.multiply(coef, x))), constraints)
        ok = _lp.solve(problem, ("ECOS",), what=self.name)
        values = _lp.values_or_fallback(x, ok, sf, gpus, self.name)
        return clip_fractions([j.job_id for j in jobs], values)
