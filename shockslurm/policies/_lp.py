"""Shared cvxpy plumbing for the Gavel-style LP/SOCP allocation policies.

One GPU type only, so the reference's ``x[i, j]`` matrix is a vector ``x[i]``. The base constraints
are written in the reference's order (``x >= 0``; GPU-time capacity; per-job ``x <= 1``) so that the
conic problem handed to ECOS has the same rows, which keeps ECOS's interior point (it decides the
non-unique parts of several allocations) as close to the reference as we can get.
"""

from __future__ import annotations

import logging
import warnings
from typing import Sequence

import cvxpy as cp
import numpy as np

from ..model import JobView

log = logging.getLogger(__name__)

#: Statuses under which the reference still reads ``x.value`` (it only warns on "inaccurate").
USABLE = (cp.OPTIMAL, cp.OPTIMAL_INACCURATE)


def sorted_jobs(jobs: Sequence[JobView]) -> list[JobView]:
    """Ascending job id: the reference flattens every dict with sorted keys."""
    return sorted(jobs, key=lambda j: j.job_id)


def gang_sizes(jobs: Sequence[JobView]) -> np.ndarray:
    return np.array([float(j.gang_size) for j in jobs])


def base_variable(sf: np.ndarray, gpus: int) -> tuple[cp.Variable, list[cp.Constraint]]:
    """``x`` with ``x >= 0``, ``sum sf * x <= gpus`` (GPU-time) and ``x <= 1`` (time fraction)."""
    x = cp.Variable(len(sf))
    constraints = [
        x >= 0,
        cp.sum(cp.multiply(sf, x)) <= gpus,
        x <= 1,
    ]
    return x, constraints


def equal_share(sf: np.ndarray, gpus: int) -> np.ndarray:
    """Gavel's "isolated" allocation ``min(1, (G/m)/sf_i)``: an equal GPU-time share per job.

    Always feasible, so it is the safe fallback when a solver gives nothing usable; Themis uses it
    as its documented fallback too.
    """
    m = len(sf)
    if m == 0:
        return np.zeros(0)
    return np.minimum(1.0, (gpus / m) / sf)


def solve(problem: cp.Problem, solvers: Sequence[str] = ("ECOS",), what: str = "policy") -> bool:
    """Try each solver in turn; True when one leaves a usable status (values are then set).

    Never raises: solver errors and unusable statuses are noted and the next solver is tried.
    A failure that a later solver makes good is logged at INFO (ECOS fails now and then on the
    larger Themis programs, and Clarabel solves them: nothing for an operator to do); only when
    every solver failed are the failures a WARNING.
    """
    failures: list[str] = []
    for solver in solvers:
        try:
            with warnings.catch_warnings():   # cvxpy warns on inaccurate points; we log instead
                warnings.simplefilter("ignore", UserWarning)
                problem.solve(solver=solver)
        except (cp.error.SolverError, ValueError, ArithmeticError) as exc:
            failures.append(f"solver {solver} failed: {exc}")
            continue
        if problem.status in USABLE:
            for failure in failures:
                log.info("%s: %s; solver %s solved it", what, failure, solver)
            if problem.status != cp.OPTIMAL:
                log.info("%s: solver %s status %s; using its point anyway (as the reference)",
                         what, solver, problem.status)
            return True
        failures.append(f"solver {solver} status {problem.status}")
    for failure in failures:
        log.warning("%s: %s", what, failure)
    return False


def values_or_fallback(x: cp.Variable, ok: bool, sf: np.ndarray, gpus: int, what: str) -> np.ndarray:
    """``x.value`` when the solve was usable, else the equal GPU-time share (logged)."""
    if ok and x.value is not None and np.all(np.isfinite(x.value)):
        return np.asarray(x.value, dtype=float)
    log.warning("%s: no usable solution; falling back to the equal GPU-time share", what)
    return equal_share(sf, gpus)
