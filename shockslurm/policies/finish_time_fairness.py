"""Themis finish-time fairness, the "finish_time_fairness" baseline (stateful).

Minimises ``max_i rho_i`` with ``rho_i = (A_i + R_i / (T_i x_i)) / (cum_iso_i + R_i / iso_i)``:
``A_i`` time since arrival, ``R_i`` remaining iterations, ``iso_i = T_i min(1, G/(m sf_i))`` the
isolated throughput among the ``m`` jobs of *this* call. ``cum_iso_i`` estimates how long the
progress so far would have taken in isolation; like the reference it is advanced only on calls, by
``(prev_R_i - R_i) / prev_iso_i``, so it is distorted when a batch-size change rescales ``R_i``.
The reference never forgets a job's ``cum_iso``; a daemon sees tens of thousands of jobs pass, so
here a job absent from `FORGET_AFTER_CALLS` calls in a row is forgotten (a job back sooner, e.g. a
live job out of the queue for a moment, keeps its account). Simulations are unchanged: a job
leaves them only when it finishes.
``priority_weight`` is ignored, as in the reference.

Solver: the reference hard-codes Gurobi, which we do not have. We solve the same SOCP (``inv_pos``)
with ECOS, then CLARABEL if ECOS gives nothing usable, then fall back to the isolated allocation
(the reference's own fallback). Only the bottleneck rho is pinned down, so non-bottleneck jobs'
fractions (and hence priorities) differ from Gurobi's point; this is an accepted fidelity gap.
"""

from __future__ import annotations

import logging
from typing import Sequence

import cvxpy as cp
import numpy as np

from ..model import JobView
from . import _lp
from .base import clip_fractions

log = logging.getLogger(__name__)

FORGET_AFTER_CALLS = 10   # calls a job may be absent from before its cum_iso is dropped


class FinishTimeFairness:
    """Min-max finish-time-fairness ratio with Themis' cumulative isolated-time account."""

    name = "finish_time_fairness"

    def __init__(self) -> None:
        self.cum_iso: dict[int, float] = {}   # the jobs of recent calls (module docstring)
        self.prev_R: dict[int, float] = {}
        self.prev_iso: dict[int, float] = {}
        self.calls = 0
        self._last_call: dict[int, int] = {}   # job id -> the latest call that had it

    def _forget_absent(self, ids: Sequence[int]) -> None:
        """Count this call; drop the jobs absent from the last `FORGET_AFTER_CALLS` calls."""
        self.calls += 1
        self._last_call.update(dict.fromkeys(ids, self.calls))
        for jid in [j for j, c in self._last_call.items()
                    if self.calls - c >= FORGET_AFTER_CALLS]:
            del self._last_call[jid]
            self.cum_iso.pop(jid, None)

    def fractions(self, jobs: Sequence[JobView], gpus: int, now: float) -> dict[int, float]:
        jobs = _lp.sorted_jobs(jobs)
        ids = [j.job_id for j in jobs]
        self._forget_absent(ids)
        if not jobs:
            self.prev_R, self.prev_iso = {}, {}
            return {}
        sf = _lp.gang_sizes(jobs)
        thr = np.array([float(j.iterations_per_s) for j in jobs])
        rem = np.array([float(j.remaining_iterations) for j in jobs])
        since = np.array([now - j.arrival_s for j in jobs])
        iso_frac = _lp.equal_share(sf, gpus)
        iso = thr * iso_frac

        t_iso = np.empty(len(jobs))
        for k, jid in enumerate(ids):
            self.cum_iso.setdefault(jid, 0.0)
            if jid in self.prev_R and self.prev_iso.get(jid, 0.0) > 0:
                self.cum_iso[jid] += (self.prev_R[jid] - rem[k]) / self.prev_iso[jid]
            t_iso[k] = self.cum_iso[jid] + (rem[k] / iso[k] if iso[k] > 0 else np.inf)

        # A job with no throughput, no work left or a non-positive isolated time has a rho that
        # x cannot change (or that is undefined); the reference never sees one, so leave it out.
        live = (thr > 0) & (rem > 0) & np.isfinite(t_iso) & (t_iso > 0)
        x, constraints = _lp.base_variable(sf, gpus)
        values: np.ndarray | None = None
        if live.any():
            idx = np.flatnonzero(live)
            shared = since[idx] + cp.multiply(rem[idx], cp.inv_pos(cp.multiply(thr[idx], x[idx])))
            rho = cp.multiply(1.0 / t_iso[idx], shared)
            objective = rho[0] if len(jobs) == 1 else cp.max(rho)
            try:
                problem = cp.Problem(cp.Minimize(objective), constraints)
            except cp.error.DCPError as exc:  # reference: isolated allocation, state not updated
                log.warning("%s: %s; using the isolated allocation", self.name, exc)
                return clip_fractions(ids, iso_frac)
            if _lp.solve(problem, ("ECOS", "CLARABEL"), what=self.name) and x.value is not None:
                values = np.asarray(x.value, dtype=float)

        self.prev_R = dict(zip(ids, rem.tolist()))
        self.prev_iso = dict(zip(ids, iso.tolist()))
        if values is None or not np.all(np.isfinite(values)):
            log.warning("%s: no usable solution; using the isolated allocation", self.name)
            values = iso_frac
        return clip_fractions(ids, values)
