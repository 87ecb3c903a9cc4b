"""Hyper-parameters of the Shockwave market, with the reference's 32-GPU defaults."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from ...limits import SETTING_CHARS, finite, shown

# Upper bounds of the options that size a re-solve's memory or time (each documented on its
# option). Measured on the 2-core development machine, one re-solve of `bench solver`'s
# 5000-job / 2048-GPU snapshot: 20 rounds 4.9 s and 22 MB at the peak, 200 rounds 12.9 s and
# 110 MB (linear in rounds x jobs: 10^6 rounds died of MemoryError); 32 breakpoints 13 s and
# 46 MB against 6's 5 s and 22 MB.
MAX_FUTURE_ROUNDS = 200
MAX_LOG_BREAKPOINTS = 32
MAX_TIME_LIMIT_S = 3600.0
# The objective's weights: beyond these the program is too ill-conditioned for HiGHS (k = 1e308
# failed every solve, each round ran on the fallback; the defaults are 1e-3 and 1)
MAX_OBJECTIVE_WEIGHT = 1e6
MIN_LOG_ZERO = -700.0          # log of the smallest float: exp(log_zero) stays above 0


@dataclass(frozen=True)
class ShockwaveConfig:
    """Every knob of the Shockwave policy.

    Defaults are the reference's `tacc_32gpus.json` (SHOCKWAVE_POLICY.md §1) but for `lam` and
    the extensions, each documented below; the other reference configs change `k` and `lam`
    (64 GPUs: k=10, lam=5; 128: k=1e-3, lam=15; 256: k=1e5, lam=5).
    """

    future_rounds: int = 20
    """T: length of the planning window, in rounds: 1 to `MAX_FUTURE_ROUNDS` (200, ten times
    the default, five times the 40 tried in the README; a re-solve's memory and time grow with
    rounds x jobs)."""
    k: float = 1e-3
    """Weight of the makespan term (1/second: it multiplies the largest remaining time)."""
    lam: float = 8.0
    """Exponent of the priority `rho ** lam` of a job behind its fairness target (relaxed path).
    The reference has 12 at 32 GPUs. 8 since 2026-11-29, chosen after each fairness ratio came
    to count from its own job's submission (docs/shockwave.md, "The priority exponent, chosen
    again"): among 6, 8, 10 and 12 on the quality matrix (120/32-900/256, 5 seeds each), the
    live benchmark's family (60 seeds), `bench switch-cost`'s workloads and the 120-job trace,
    the smallest whose worst rho stays within 0.05 of 12's at every size of the matrix. Against
    12 it shortens the average JCT everywhere (the matrix's median against max_min_fairness
    without the gate 1.16-1.02x -> 1.22-1.08x) at an equal makespan; 6 shortens it further but
    its worst rho is 0.09 higher at 220/64."""
    rhomax: float = 1.0
    """Allowed ratio of planned finish time to fairness target (FTF constraint, priority threshold)."""
    log_breakpoints: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    """Breakpoints of the piecewise-linear log of the progress fraction (log 0 -> log 1e-6):
    2 to `MAX_LOG_BREAKPOINTS` (32; each adds a constraint per job to every program; 8 is the
    most tried, docs/history.md)."""
    log_zero: float = math.log(1e-6)
    resolve_every: int = 8
    """Re-solve after this many rounds without an arrival or completion (else replay the plan)."""
    solver_gap: float = 1e-3
    """Relative MIP gap."""
    time_limit_s: float = 30.0
    """Wall-clock safety net of one re-solve (both attempts together): the work limit of the
    market (`market.MIP_STALL_WORK`) decides when the solver stops, so this is reached only on
    a far slower or overloaded machine (it logs a warning; the plan then depends on the load).
    On expiry without a solution the planner falls back to the previous plan or a fair greedy
    schedule. Above 0 and at most `MAX_TIME_LIMIT_S` (an hour: a longer net would let one
    re-solve hold the daemon's rounds for hours)."""
    mip_time_limit_s: float = 10.0
    """Wall-clock safety net of the integer program in one attempt (logs a warning when hit;
    the best solution HiGHS has is used, status "feasible"). The deciding limit is a work limit:
    1,000 identical pending jobs on 32 GPUs, the hardest case measured, stop after about 2 s on
    the 2-core development machine. Above 0 and at most `MAX_TIME_LIMIT_S` (an hour)."""
    momentum: float = 0.9
    """Weight of the time-weighted average in the fairness target (rest: latest estimate)."""
    finish_exponent: float = 100.0
    """Priority exponent for a job behind target whose forecast is under one round."""
    priority_cap: float = 1e6
    """Priorities are capped here (the reference has no cap; rho**100 overflows solvers). Capping
    (not rescaling) keeps the trade-off of uncapped jobs against the k term unchanged."""
    tail_weight: float = 1.0
    """Extension (0 = the reference; 120-job trace, measured 2026-11-24: makespan 24,957 s ->
    23,747 s, 5.8 % -> 5.0 % unfair): adds `tail_weight * k * sum_j max(0, r_j - drain)` to the
    makespan term, where drain = the time the whole cluster needs for all remaining work after
    the window. Every job that would outlast the drain is pushed, not only the longest one."""
    work_exponent: float = 1.5
    """Extension (0 = the reference): each job's welfare weight, and so its priority, is
    multiplied by `(median remaining GPU-seconds / the job's remaining GPU-seconds) **
    work_exponent`, remaining GPU-seconds being the forecast's remaining time times the gang.
    The weights are relative to the median of the jobs in the round, so they do not depend on
    the cluster's size, the number of jobs or the unit of time. Jobs with little work left
    then finish first, as under shortest-remaining-work-first, within the fairness targets'
    priorities. 1.5 was chosen among 0, 0.5, 0.75, 1 and 1.5 (1.25 and 2 in part) on the
    quality matrix (120/32-900/256, 5 seeds each), `bench switch-cost`'s workloads, the live
    benchmark's workload family (60 seeds) and the 120-job trace: docs/shockwave.md,
    "Work-weighted welfare"."""
    fill_order: str = "remaining"
    """Work conservation order: "remaining" (reference: longest forecast remaining time first)
    or "rho" (highest projected finish-time-fairness ratio first)."""
    tail_drain_factor: float = 0.95
    """The drain time of `tail_weight` is multiplied by this factor (> 1: only clear outliers;
    < 1: the tail pushes jobs a little before they would outlast the drain). 0.95 was chosen on
    2026-11-26 (docs/shockwave.md, "The tail's drain") among 1.25 (chosen earlier on the
    120-job trace alone), 1.0 and 0.9 on the quality matrix (120/32-900/256, 5 seeds each): the
    median makespan against max_min_fairness is 1.09-1.22x at 1.25, 1.16-1.33x at 1.0,
    1.19-1.33x at 0.95 and 1.22-1.35x at 0.9, the average JCT 1.06-1.18x, 1.03-1.17x,
    1.01-1.16x and 1.00-1.16x (0.998x at 900/256: worse than max_min_fairness's); of those,
    0.95 is the largest factor whose makespan is 1.3x at 460/128 and 900/256. At 5000/2048,
    whose makespan is the longest job's at every factor, it cost average JCT (0.99x of
    max_min_fairness's at 1.25, 0.956x at 0.95) until `tail_longest_factor`. The live
    benchmark's family does not move."""
    tail_longest_factor: float = 0.8
    """The drain of `tail_weight` is at least the longest remaining time of any job times this
    factor (0: the cluster's drain alone, as before 2026-11-27). Where one job outlasts what
    the whole cluster needs for all the work left (the longest job, not the work, sets the
    makespan), pushing every job past the cluster's drain only delays the short ones: the jobs
    within a fifth of the longest are pushed, the others keep their welfare weights. 0.8 was
    chosen on 2026-11-27 (docs/shockwave.md, "The tail's drain") among 0, 0.7, 0.8 and 0.9 on
    the quality matrix (120/32-900/256, 5 seeds each; 0 and 0.8 also at 2000/512 and
    5000/2048): the median makespan against max_min_fairness stays 1.19-1.33x (0.9: 1.31x at
    460/128), the average JCT grows from 1.01-1.16x to 1.03-1.18x, and at 5000/2048, whose
    makespan is the longest job's, from 0.956x to 1.002x. 1.0 (no job pushed until it is the
    longest) was tried on 2026-11-26 and costs makespan: 1.06-1.15x."""
    progress_model: str = "forecast"
    """Epoch duration that converts planned rounds into planned epochs. "past": the reference's
    mean duration of the epochs seen so far (dbar). "forecast" (default): the forecast's mean
    duration of the epochs still to come, R_j / (E_j - e_j - 1). With "past", a job whose future
    epochs are slower than its past ones can never bring its remaining time r_j to zero, so the
    makespan term stalls on it and the other long jobs starve (makespan +7 % on the 120-job
    trace when chosen; with the tail term, 2026-11-24 evening: 24,007 s against 23,747 s)."""
    integer_rounds: bool = True
    """Solve the aggregated program as a MIP (integer rounds per job); False: LP + rounding."""
    mip_max_jobs: int = 1500
    """Above this many jobs the LP relaxation is solved and rounded (`market.lp_rounding`: what
    the planned progress needs, rounded up, then rounds taken back where the objective loses
    least per GPU). On the 120-job trace, LP plus rounding end to end gives makespan 23,987 s,
    avg JCT 9,945 s, worst rho 1.20 (the integer program: 23,747 s, 9,867 s, 1.20)."""

    def __post_init__(self) -> None:
        for f in fields(self):   # values from TOML or the command line: check each type
            object.__setattr__(self, f.name, _typed(f.name, getattr(self, f.name), f.default))
        if not 1 <= self.future_rounds <= MAX_FUTURE_ROUNDS:
            raise ValueError(f"future_rounds must be in 1..{MAX_FUTURE_ROUNDS}, "
                             f"got {self.future_rounds!r}")
        if self.resolve_every < 1:
            raise ValueError("resolve_every must be >= 1")
        bp = self.log_breakpoints
        if len(bp) > MAX_LOG_BREAKPOINTS:
            raise ValueError(f"log_breakpoints must hold at most {MAX_LOG_BREAKPOINTS} values, "
                             f"got {len(bp)}")
        if len(bp) < 2 or bp[0] != 0.0 or bp[-1] != 1.0 or list(bp) != sorted(set(bp)):
            raise ValueError("log_breakpoints must rise strictly from 0 to 1")
        if self.progress_model not in ("forecast", "past"):
            raise ValueError("progress_model must be 'forecast' or 'past'")
        for name in ("time_limit_s", "mip_time_limit_s"):
            if not 0 < getattr(self, name) <= MAX_TIME_LIMIT_S:
                raise ValueError(f"{name} must be > 0 and <= {MAX_TIME_LIMIT_S:g}, "
                                 f"got {getattr(self, name)!r}")
        if self.priority_cap < 1:
            raise ValueError("priority_cap must be >= 1")
        for name in ("k", "lam", "solver_gap", "finish_exponent", "tail_weight",
                     "work_exponent", "tail_longest_factor"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("k", "tail_weight"):
            if getattr(self, name) > MAX_OBJECTIVE_WEIGHT:
                raise ValueError(f"{name} must be <= {MAX_OBJECTIVE_WEIGHT:g}, got "
                                 f"{getattr(self, name)!r}")
        if not MIN_LOG_ZERO <= self.log_zero < math.log(bp[1]):   # concave: below log(bp[1])
            raise ValueError(f"log_zero must be >= {MIN_LOG_ZERO:g} and below the log of the "
                             f"first breakpoint after 0 ({math.log(bp[1]):.3g}), got "
                             f"{self.log_zero!r}")
        for name in ("rhomax", "tail_drain_factor"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if not 0 <= self.momentum <= 1:
            raise ValueError(f"momentum must be in [0, 1], got {self.momentum!r}")
        if self.fill_order not in ("remaining", "rho"):
            raise ValueError("fill_order must be 'remaining' or 'rho'")
        if self.mip_max_jobs < 0:
            raise ValueError("mip_max_jobs must be >= 0")


def _typed(name: str, value: Any, default: Any) -> Any:
    """`value` as the type of the field's default (an int is a float, a list of numbers a
    tuple); a ValueError naming the field otherwise. Numbers must be finite."""
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        raise ValueError(f"{name} must be true or false, got {shown(value, SETTING_CHARS)}")
    if isinstance(default, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ValueError(f"{name} must be an integer, got {shown(value, SETTING_CHARS)}")
    if isinstance(default, float):
        if finite(value) is not None:
            return float(value)
        raise ValueError(f"{name} must be a finite number, got {shown(value, SETTING_CHARS)}")
    if isinstance(default, str):
        if isinstance(value, str):
            return value
        raise ValueError(f"{name} must be a string, got {shown(value, SETTING_CHARS)}")
    if isinstance(default, tuple):
        if isinstance(value, (list, tuple)) and all(finite(v) is not None for v in value):
            return tuple(float(v) for v in value)
        raise ValueError(f"{name} must be a list of finite numbers, got "
                         f"{shown(value, SETTING_CHARS)}")
    raise AssertionError(name)  # pragma: no cover - a field of another type
