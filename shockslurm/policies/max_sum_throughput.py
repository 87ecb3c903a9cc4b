"""Gavel's max-sum-throughput ("max_sum_throughput_perf"): maximise ``sum_i T_i x_i``.

As in the reference, the objective uses raw whole-gang iterations/s with no normalisation and the
gang size appears only in the capacity constraint, so the LP is a fractional knapsack by
``T_i / sf_i`` (favouring small-batch, high-it/s jobs). Ties at the knapsack boundary are split
evenly by ECOS's interior point (e.g. 40 identical 1-GPU jobs on 32 GPUs get 0.8 each), which is
why we solve with ECOS instead of sorting.
"""

from __future__ import annotations

from typing import Sequence

import cvxpy as cp
import numpy as np

from ..model import JobView
from . import _lp
from .base import clip_fractions


class MaxSumThroughput:
    """Maximise total (raw) throughput under the GPU-time capacity."""

    name = "max_sum_throughput"

    def fractions(self, jobs: Sequence[JobView], gpus: int, now: float) -> dict[int, float]:
        jobs = _lp.sorted_jobs(jobs)
        if not jobs:
            return {}
        sf = _lp.gang_sizes(jobs)
        thr = np.array([float(j.iterations_per_s) for j in jobs])
        x, constraints = _lp.base_variable(sf, gpus)
        problem = cp.Problem(cp.Maximize(cp.sum(cp.multiply(thr, x))), constraints)
        ok = _lp.solve(problem, ("ECOS",), what=self.name)
        values = _lp.values_or_fallback(x, ok, sf, gpus, self.name)
        return clip_fractions([j.job_id for j in jobs], values)
