"""The volatile Fisher market of one re-solve, as an aggregated program solved with HiGHS.

The reference solves a MILP over `x[j,t]` (job j runs in window round t) with SOS2 booleans for a
piecewise-linear log. Two observations make it small:

1. Nothing in its objective or constraints depends on *which* window rounds a job gets, only on
   how many: `n_j = sum_t x[j,t]`. The capacity of the rounds is then `sum_j w_j n_j <= G T` plus
   `n_j <= T`; where the gang sizes do not tile the rounds exactly, the packing step of the
   planner (`planner.pack`) repairs the plan (it replaces the reference's ordering MILP).
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

The reported objective is in the reference's scale: sum_j prio_j u_j / (N T) - k max_j r_j.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import highspy
import numpy as np

log = logging.getLogger(__name__)


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


def segments(breakpoints, log_zero: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(b_k, v_k, slope_k) of each segment of the piecewise-linear log."""
    b = np.asarray(breakpoints, dtype=float)
    v = np.array([log_zero] + [math.log(x) for x in b[1:]])
    s = np.diff(v) / np.diff(b)
    return b[:-1], v[:-1], s


def solve_market(inp: MarketInput, *, breakpoints, log_zero: float, integer: bool,
                 gap: float, time_limit_s: float,
                 mip_time_limit_s: float = math.inf) -> MarketResult:
    """Build the aggregated program in matrix form and solve it with HiGHS, within
    `time_limit_s` (and `mip_time_limit_s` for the integer program)."""
    t0 = time.perf_counter()
    n = len(inp.gang)
    if n == 0:
        return MarketResult("optimal", np.zeros(0, int), np.zeros(0), 0.0, 0.0)
    if time_limit_s <= 0:
        return MarketResult("no-solution", None, None, float("nan"), 0.0)
    T = inp.rounds
    a = np.maximum(inp.full_rounds.astype(float), 1e-9)
    f_hi = np.clip(1.0 - inp.frac_done, 0.0, 1.0)
    f_lo = np.minimum(np.maximum(inp.f_lower, 0.0), f_hi)
    nmax = np.minimum(np.ceil(a * f_hi - 1e-9), T).astype(float)
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
    row_lo = [[-inf], np.full(n, -inf), np.full(K * n, -inf), inp.remaining_rounds]
    row_hi = [[float(inp.gpus * T)], np.zeros(n), *cut_hi, np.full(n, inf)]
    if tail:   # s_j + a_j f_j >= R_j/L - drain
        rows += [nrow + j, nrow + j]; cols += [iS + j, iF + j]; vals += [np.ones(n), a]
        row_lo.append(inp.remaining_rounds - inp.drain_rounds); row_hi.append(np.full(n, inf))
        nrow += n
    row_lo, row_hi = np.concatenate(row_lo), np.concatenate(row_hi)

    r = np.concatenate(rows); c = np.concatenate(cols); v = np.concatenate(vals)
    order = np.lexsort((r, c))
    r, c, v = r[order], c[order], v[order]
    start = np.searchsorted(c, np.arange(ncol + 1))

    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = ncol, nrow
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = cost, lo, hi
    lp.row_lower_, lp.row_upper_ = row_lo, row_hi
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = start.astype(np.int32)
    lp.a_matrix_.index_ = r.astype(np.int32)
    lp.a_matrix_.value_ = v
    if integer:
        integ = [highspy.HighsVarType.kContinuous] * ncol
        for i in range(n):
            integ[iN + i] = highspy.HighsVarType.kInteger
        lp.integrality_ = integ

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    left = time_limit_s - (time.perf_counter() - t0)
    if integer:
        left = min(left, mip_time_limit_s)
    h.setOptionValue("time_limit", float(max(left, 1e-6)))
    h.setOptionValue("mip_rel_gap", float(gap))
    h.setOptionValue("random_seed", 0)
    try:
        h.passModel(lp)
        h.run()
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
    if status not in ("optimal", "feasible"):
        return MarketResult(status, None, None, float("nan"), elapsed)
    x = np.asarray(h.getSolution().col_value)
    f = np.clip(x[iF:iF + n], f_lo, f_hi)
    rounds_ = x[iN:iN + n]
    if integer:
        rounds_ = np.round(rounds_)
    else:
        rounds_ = lp_rounding(rounds_, a, f, inp.gang, inp.gpus * T)
    # never keep rounds the planned progress does not need (the program does not penalise them)
    need = np.ceil(a * f - 1e-6)
    rounds_ = np.minimum(rounds_, np.maximum(need, 0)).astype(int)
    f = np.minimum(f, rounds_ / a)
    u = np.min(vk[:, None] + sk[:, None] * (inp.frac_done + f - bk[:, None]), axis=0)
    mk = max(0.0, float(np.max(inp.remaining_rounds - a * f)))
    obj = float(np.sum(inp.priority * u)) / (n * T) - inp.k_round * mk
    return MarketResult(status, rounds_, f, obj, elapsed)


def lp_rounding(n_lp: np.ndarray, a: np.ndarray, f: np.ndarray, gang: np.ndarray,
                capacity: int) -> np.ndarray:
    """Round an LP solution's rounds to integers within the capacity: round up what the planned
    progress needs, then take rounds back from the jobs with the most slack until it fits."""
    n_int = np.ceil(np.minimum(n_lp, a * f) - 1e-6).clip(min=0)
    over = float(np.dot(gang, n_int)) - capacity
    if over > 0:
        frac = n_int - np.minimum(n_lp, a * f)      # rounding-up excess per job
        for i in np.argsort(-frac):
            if over <= 0:
                break
            if n_int[i] > 0 and frac[i] > 0:
                n_int[i] -= 1
                over -= gang[i]
    return n_int
