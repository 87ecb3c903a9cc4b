"""The volatile Fisher market of one re-solve, as an aggregated program solved with HiGHS.

The reference solves a MILP over `x[j,t]` (job j runs in window round t) with SOS2 booleans for a
piecewise-linear log. Two observations make it small:

1. Nothing in its objective or constraints depends on *which* window rounds a job gets, only on
   how many: `n_j = sum_t x[j,t]`. The capacity of the rounds is then `sum_j w_j n_j <= G T` plus
   `n_j <= T`. The planner lays the rounds out round by round (`packing.py`; it replaces the
   reference's ordering MILP) and, where its layout cannot hold what the market chose, solves
   again with each job capped at the rounds the layout gives it (`MarketInput.round_cap`).
2. The log utility enters the objective with a positive weight and is concave, so the SOS2
   emulation is equivalent to the epigraph `u_j <= v_k + s_k (x_j - b_k)` over the segments of
   the breakpoints (no booleans), and `max_j r_j` is an epigraph variable `M`.

Variables (per job j, N jobs): `n_j` integer in [0, nmax_j] (rounds), `f_j` = planned progress
over the window as a fraction of the job's epochs, in [f_lo_j, 1 - e_j/E_j], `u_j` the
approximated log of `(e_j + p_j)/E_j`, and one `M >= 0` (rounds).
With `a_j = E_j dbar_j / L` (rounds to run the whole job at the past-average epoch duration):

    capacity   sum_j w_j n_j <= G T
    progress   a_j f_j <= n_j                           (p_j dbar_j <= L n_j)
    log cuts   u_j - s_k f_j <= v_k + s_k (e_j/E_j - b_k)   for every segment k
    makespan   M + a_j f_j >= R_j / L                   (M >= r_j / L)
    FTF        f_lo_j from r_j/share <= rhomax target_j - (now + T L)  (a bound, first attempt)

    minimise   - sum_j prio_j u_j  +  k L N T M           (= N T x the reference's objective)

The reported objective is in the reference's scale: sum_j prio_j u_j / (N T) - k max_j r_j
(minus the tail term when it is on); `placed_objective` scores the plan as `pack` laid it out.

Deterministic: the same input gives the same plan on any machine load. HiGHS runs on one thread
with a fixed random seed, and a *work* limit, not the clock, ends a long integer program. Work is
counted in search steps (HiGHS's limit checks: one per cut round at the root, one per node of the
tree), a step of a program over N jobs weighing N (a cut round or node costs about in proportion
to N). The search stops once `MIP_STALL_WORK` (9,000 job-steps, at least 20 steps) has passed
since its last improving solution, or after `MIP_MAX_WORK` (200,000 job-steps, at least 100
steps) in all, and keeps its best solution (status "feasible").

Why these numbers. Many identical jobs make the program symmetric: HiGHS finds its best plan
within two steps and then grinds through cut rounds to prove it (1,000 identical jobs on 32
GPUs: still the same plan after 20 s); there the limit stops it after 20 steps, about 2 s on the
2-core development machine. On the 120-job trace, on reference-like workloads (120/32 one seed,
220/64 and 460/128 two seeds each) and on `bench solver`'s snapshots every solve stopped after
30 steps without an improvement ends with the plan it has without any limit (N <= 301 there: the
limit allows at least 30 steps). On an overloaded 200-job / 16-GPU reference-like workload,
whose relaxed programs go deep into the tree, 79 of 99 sampled solves keep the plan they have
without a limit, the others score at most 0.45 % (mean 0.04 %) below it, and the solves take
0.47 s on average instead of 0.76 s. The wall-clock limits (`time_limit_s`, `mip_time_limit_s`)
remain only as a safety net: hitting one logs a warning, since the plan then depends on the
machine's speed and load.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Sequence

import highspy
import numpy as np

log = logging.getLogger(__name__)

MIP_STALL_WORK = 9_000
"""Job-steps without an improving solution after which the integer program stops."""
MIP_MAX_WORK = 200_000
"""Job-steps after which the integer program stops in any case."""
MIN_STALL_STEPS, MIN_MAX_STEPS = 20, 100


def exact_dot(a: np.ndarray, b: np.ndarray) -> float:
    """`sum_i a_i b_i`, exactly rounded (`math.fsum`). Not `np.dot`: that calls BLAS, whose
    kernel, picked at run time for the CPU, sums in its own order, so the last bits of the
    result, and then a plan, would differ between machines (with OpenBLAS's AVX-512 kernel
    the 120-job trace gave 23,747 s against 23,767 s with its Haswell kernel)."""
    return math.fsum(np.multiply(a, b, dtype=float).tolist())


def step_limits(jobs: int) -> tuple[int, int]:
    """(stall steps, most steps) of a program over `jobs` jobs."""
    jobs = max(jobs, 1)
    return (max(MIN_STALL_STEPS, math.ceil(MIP_STALL_WORK / jobs)),
            max(MIN_MAX_STEPS, math.ceil(MIP_MAX_WORK / jobs)))

@dataclass
class MarketInput:
    """One re-solve's data, one array entry per job (all float64 / int64 arrays)."""

    gang: np.ndarray         # w_j
    frac_done: np.ndarray    # e_j / E_j
    full_rounds: np.ndarray  # a_j = E_j dbar_j / L
    remaining_rounds: np.ndarray  # R_j / L
    priority: np.ndarray     # prio_j (1 on the first attempt)
    f_lower: np.ndarray      # FTF lower bound on f_j (0 on the relaxed attempt)
    gpus: int
    rounds: int              # T
    k_round: float           # k * L (weight of M, in rounds)
    tail_weight: float = 0.0  # weight (relative to M) of sum_j max(0, r_j/L - drain)
    drain_rounds: float = 0.0  # rounds the cluster needs after the window for all remaining work
    round_cap: np.ndarray | None = None  # most rounds each job may get (None: T)

    @property
    def rounds_per_job(self) -> np.ndarray:
        """`a_j` as the program uses it: `full_rounds` kept away from 0 (it divides)."""
        a: np.ndarray = np.maximum(self.full_rounds.astype(float), 1e-9)
        return a


@dataclass
class MarketResult:
    status: str              # "optimal", "feasible" (limit hit with a solution), "infeasible",
                             # "no-solution" (limit hit without one), "error"
    rounds: np.ndarray | None   # n_j, integers
    progress: np.ndarray | None  # f_j
    objective: float
    solve_s: float

    @property
    def ok(self) -> bool:
        return self.rounds is not None


# One thread and a fixed seed: HiGHS then takes the same path through the search on every run.
DETERMINISTIC_OPTIONS: dict[str, int | str] = {"threads": 1, "parallel": "off", "random_seed": 0}


class _QuietHighs(highspy.Highs):
    """`highspy.Highs` that never prints HiGHS's banner: output is switched off before the
    constructor's first log call (`enableCallbacks`), which would print it on stdout once per
    process (into a daemon's log or a `--json /dev/stdout`)."""

    def enableCallbacks(self) -> None:
        self.setOptionValue("output_flag", False)
        super().enableCallbacks()  # type: ignore[no-untyped-call]


def _run_single_threaded(h: highspy.Highs) -> None:
    """`h.run()` on one thread. HiGHS (1.16) refuses to run (status error, model not set) when
    its process-wide task scheduler was started with another thread count, e.g. by an earlier
    Highs object with the default options: restart the scheduler then and run again."""
    if (h.run() == highspy.HighsStatus.kError
            and h.getModelStatus() == highspy.HighsModelStatus.kNotset):
        highspy.Highs.resetGlobalScheduler(True)
        h.run()


def segments(breakpoints: Sequence[float], log_zero: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(b_k, v_k, slope_k) of each segment of the piecewise-linear log."""
    b = np.asarray(breakpoints, dtype=float)
    v = np.array([log_zero] + [math.log(x) for x in b[1:]])
    s = np.diff(v) / np.diff(b)
    return b[:-1], v[:-1], s


class WorkLimit:
    """Stops HiGHS's integer search after `stall` steps without an improving solution or `most`
    steps in all (a step: one of HiGHS's limit checks, at each root cut round and tree node)."""

    def __init__(self, stall: int, most: int) -> None:
        self.stall, self.most = stall, most
        self.steps = 0
        self.last_improvement: int | None = None
        self.hit = False

    def attach(self, h: highspy.Highs) -> None:
        h.cbMipInterrupt.subscribe(self._check)
        h.cbMipImprovingSolution.subscribe(self._improved)

    def _improved(self, event: Any) -> None:
        self.last_improvement = self.steps

    def _check(self, event: Any) -> None:
        self.steps += 1
        stalled = (self.last_improvement is not None
                   and self.steps - self.last_improvement >= self.stall)
        if stalled or self.steps >= self.most:
            self.hit = True
            event.interrupt()


def solve_market(inp: MarketInput, *, breakpoints: Sequence[float], log_zero: float, integer: bool,
                 gap: float, time_limit_s: float, mip_time_limit_s: float = math.inf,
                 stall_steps: int | None = None,
                 max_steps: int | None = None) -> MarketResult:
    """Build the aggregated program in matrix form and solve it with HiGHS: the integer program
    within the work limit (`stall_steps`, `max_steps`; default `step_limits(N)`); the
    wall-clock `time_limit_s` (and `mip_time_limit_s` for the integer program) is a safety net
    that logs a warning when it ends the solve."""
    t0 = time.perf_counter()
    n = len(inp.gang)
    if n == 0:
        return MarketResult("optimal", np.zeros(0, int), np.zeros(0), 0.0, 0.0)
    if time_limit_s <= 0:
        return MarketResult("no-solution", None, None, float("nan"), 0.0)
    T = inp.rounds
    a = inp.rounds_per_job
    f_hi = np.clip(1.0 - inp.frac_done, 0.0, 1.0)
    f_lo = np.minimum(np.maximum(inp.f_lower, 0.0), f_hi)
    nmax = np.minimum(np.ceil(a * f_hi - 1e-9), T).astype(float)
    if inp.round_cap is not None:
        nmax = np.minimum(nmax, inp.round_cap)
        f_hi = np.minimum(f_hi, nmax / a)
        f_lo = np.minimum(f_lo, f_hi)
    bk, vk, sk = segments(breakpoints, log_zero)
    K = len(sk)

    # columns: n (0..n-1), f (n..2n-1), u (2n..3n-1), M (3n), tail excess s (3n+1..4n)
    tail = inp.tail_weight > 0
    ncol = 3 * n + 1 + (n if tail else 0)
    iN, iF, iU, iM, iS = 0, n, 2 * n, 3 * n, 3 * n + 1
    cost = np.zeros(ncol)
    cost[iU:iU + n] = -inp.priority
    cost[iM] = inp.k_round * n * T
    lo = np.concatenate([np.zeros(n), f_lo, np.full(n, log_zero), [0.0], np.zeros(ncol - 3 * n - 1)])
    hi = np.concatenate([nmax, f_hi, np.zeros(n), [highspy.kHighsInf],
                         np.full(ncol - 3 * n - 1, highspy.kHighsInf)])
    if tail:
        cost[iS:iS + n] = inp.tail_weight * inp.k_round * n * T

    # rows: capacity (1), progress (n), cuts (K n), makespan (n)
    j = np.arange(n)
    rows, cols, vals = [], [], []
    rows.append(np.zeros(n, int)); cols.append(iN + j); vals.append(inp.gang.astype(float))
    r0 = 1
    rows += [r0 + j, r0 + j]; cols += [iF + j, iN + j]; vals += [a, -np.ones(n)]
    r0 += n
    cut_hi = []
    for k in range(K):
        rows += [r0 + j, r0 + j]; cols += [iU + j, iF + j]; vals += [np.ones(n), np.full(n, -sk[k])]
        cut_hi.append(vk[k] + sk[k] * (inp.frac_done - bk[k]))
        r0 += n
    rows += [r0 + j, r0 + j]; cols += [np.full(n, iM), iF + j]; vals += [np.ones(n), a]
    nrow = r0 + n
    inf = highspy.kHighsInf
    row_lo: list[Any] = [[-inf], np.full(n, -inf), np.full(K * n, -inf), inp.remaining_rounds]
    row_hi: list[Any] = [[float(inp.gpus * T)], np.zeros(n), *cut_hi, np.full(n, inf)]
    if tail:   # s_j + a_j f_j >= R_j/L - drain
        rows += [nrow + j, nrow + j]; cols += [iS + j, iF + j]; vals += [np.ones(n), a]
        row_lo.append(inp.remaining_rounds - inp.drain_rounds); row_hi.append(np.full(n, inf))
        nrow += n
    row_lower, row_upper = np.concatenate(row_lo), np.concatenate(row_hi)

    r = np.concatenate(rows); c = np.concatenate(cols); v = np.concatenate(vals)
    order = np.lexsort((r, c))
    r, c, v = r[order], c[order], v[order]
    start = np.searchsorted(c, np.arange(ncol + 1))

    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = ncol, nrow
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = cost, lo, hi
    lp.row_lower_, lp.row_upper_ = row_lower, row_upper
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = start.astype(np.int32)
    lp.a_matrix_.index_ = r.astype(np.int32)
    lp.a_matrix_.value_ = v
    if integer:
        integ = [highspy.HighsVarType.kContinuous] * ncol
        for i in range(n):
            integ[iN + i] = highspy.HighsVarType.kInteger
        lp.integrality_ = integ

    h = _QuietHighs()  # type: ignore[no-untyped-call]
    left = time_limit_s - (time.perf_counter() - t0)
    if integer:
        left = min(left, mip_time_limit_s)
    h.setOptionValue("time_limit", float(max(left, 1e-6)))
    h.setOptionValue("mip_rel_gap", float(gap))
    for option, value in DETERMINISTIC_OPTIONS.items():
        h.setOptionValue(option, value)
    default_stall, default_most = step_limits(n)
    work = WorkLimit(stall_steps or default_stall, max_steps or default_most)
    if integer:
        work.attach(h)
    try:
        h.passModel(lp)
        _run_single_threaded(h)
    except Exception:  # pragma: no cover - solver crash: treated as no solution
        log.exception("HiGHS failed on the Shockwave market")
        return MarketResult("error", None, None, float("nan"), time.perf_counter() - t0)
    ms = h.getModelStatus()
    info = h.getInfo()
    has_sol = info.primal_solution_status == 2
    M = highspy.HighsModelStatus
    if ms in (M.kInfeasible, M.kUnboundedOrInfeasible):
        status = "infeasible"
    elif ms == M.kOptimal and has_sol:
        status = "optimal"
    elif has_sol:
        status = "feasible"
    else:
        status = "no-solution" if ms in (M.kTimeLimit, M.kInterrupt, M.kIterationLimit) else "error"
    elapsed = time.perf_counter() - t0
    if ms == M.kTimeLimit:
        log.warning("shockwave market: the wall-clock limit (%.2f s) ended HiGHS before its work "
                    "limit (%d jobs, %s, %d steps); the plan may differ from run to run",
                    left, n, status, work.steps)
    if status not in ("optimal", "feasible"):
        return MarketResult(status, None, None, float("nan"), elapsed)
    x = np.asarray(h.getSolution().col_value)
    f = np.clip(x[iF:iF + n], f_lo, f_hi)
    rounds_ = x[iN:iN + n]
    if integer:
        rounds_ = np.round(rounds_)
    else:
        rounds_ = lp_rounding(inp, rounds_, f, breakpoints=breakpoints, log_zero=log_zero)
    # never keep rounds the planned progress does not need (the program does not penalise them)
    need = np.ceil(a * f - 1e-6)
    rounds_ = np.minimum(rounds_, np.maximum(need, 0)).astype(int)
    f = np.minimum(f, rounds_ / a)
    obj = market_objective(inp, f, breakpoints=breakpoints, log_zero=log_zero)
    return MarketResult(status, rounds_, f, obj, elapsed)


def market_objective(inp: MarketInput, progress: np.ndarray, *, breakpoints: Sequence[float],
                     log_zero: float) -> float:
    """The program's objective in the reference's scale for planned progress `progress` (f_j):
    `sum_j prio_j u_j / (N T) - k L max_j r_j / L`, minus the tail term
    `tail_weight k L sum_j max(0, r_j / L - drain)` when it is on."""
    if len(inp.gang) == 0:
        return 0.0
    welfare, left, tail = _objective_terms(inp, progress, breakpoints, log_zero)
    return (float(np.sum(welfare)) - inp.k_round * max(0.0, float(np.max(left)))
            - inp.tail_weight * inp.k_round * float(np.sum(tail)))


def _objective_terms(inp: MarketInput, progress: np.ndarray, breakpoints: Sequence[float],
                     log_zero: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per job: its welfare term `prio_j u_j / (N T)`, its rounds left `r_j / L` after the
    planned progress, and its rounds beyond the drain (the tail term's part)."""
    n, T = len(inp.gang), inp.rounds
    bk, vk, sk = segments(breakpoints, log_zero)
    a = inp.rounds_per_job
    u = np.min(vk[:, None] + sk[:, None] * (inp.frac_done + progress - bk[:, None]), axis=0)
    left = inp.remaining_rounds - a * progress
    return inp.priority * u / (n * T), left, np.maximum(0.0, left - inp.drain_rounds)


def placed_objective(inp: MarketInput, progress: np.ndarray, placed_rounds: np.ndarray, *,
                     breakpoints: Sequence[float], log_zero: float) -> float:
    """`market_objective` of the plan as laid out: each job's planned progress cut to what the
    rounds it was given (`placed_rounds`, e.g. after `planner.pack`) allow."""
    a = inp.rounds_per_job
    return market_objective(inp, np.minimum(progress, placed_rounds / a),
                            breakpoints=breakpoints, log_zero=log_zero)


def lp_rounding(inp: MarketInput, n_lp: np.ndarray, f: np.ndarray, *,
                breakpoints: Sequence[float], log_zero: float) -> np.ndarray:
    """Round an LP solution's rounds to integers within the capacity: round up what the planned
    progress needs; while that is over the capacity, take one round back from each rounded-up
    job in turn, the job whose loss to the market's objective (`market_objective`: welfare,
    makespan and tail terms) per GPU freed is least first. One round from each would always be
    enough: each was rounded up by less than a round, and the LP's rounds fit the capacity."""
    a = inp.rounds_per_job
    used = np.minimum(n_lp, a * f)
    n_int: np.ndarray = np.ceil(used - 1e-6).clip(min=0)
    over = exact_dot(inp.gang, n_int) - inp.gpus * inp.rounds
    if over <= 0:
        return n_int
    candidates = (n_int > 0) & (n_int - used > 0)
    less = np.minimum(f, (n_int - 1).clip(min=0) / a)        # progress with one round fewer
    welfare, left, tail = _objective_terms(inp, f, breakpoints, log_zero)
    welfare2, left2, tail2 = _objective_terms(inp, less, breakpoints, log_zero)
    top = max(0.0, float(np.max(left)))          # the makespan term's max_j r_j / L
    loss = (welfare - welfare2 + inp.k_round * (np.maximum(left2, top) - top)
            + inp.tail_weight * inp.k_round * (tail2 - tail)) / np.maximum(inp.gang, 1)
    for i in np.argsort(loss, kind="stable"):   # ties: the lower index first
        if over <= 0:
            break
        if candidates[i]:
            n_int[i] -= 1
            over -= inp.gang[i]
    return n_int
