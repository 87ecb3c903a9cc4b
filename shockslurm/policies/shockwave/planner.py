"""The Shockwave round policy: fairness targets, re-solve/replay, packing, work conservation.

Per round (`allocate`):
1. Track arrivals (admission time = the job's submission, `JobView.arrival_s`, at the latest
   the round where it is first seen: a job that waited for its first round, or was submitted
   before the daemon (re)started, is not counted as new) and completions; forecast every job
   (`forecast.forecast`, which also calibrates).
2. Re-solve on any arrival or completion, when `resolve_every` rounds have passed since the last
   solve, or when the stored plan has no entry for this round; otherwise replay the stored plan.
   (The reference counts its periodic re-solves from round 0 regardless of event re-solves; we
   count from the last solve.)
3. A re-solve: on arrival/completion every job's finish-time-fairness series gets a new estimate
   `F_j = submit_j + (profile time of completed epochs + R_j) / min(1, G/N)`; the target is the
   time-weighted average of the series with momentum. Each job's welfare weight is
   `w_j = (median remaining GPU-seconds / its own) ** work_exponent` (`work_weights`; all 1 in
   the reference). First attempt: the market with the FTF bounds and weights `w_j`; if
   infeasible (or no solution in time), the relaxed market with priorities
   `min(cap, w_j rho_j ** lam)` for jobs behind target (`rho ** 100` if they would finish
   within a round; `w_j` for the others). Fairness ratios: `rho_j = (now + R_j/share - s_j) /
   (F_j - s_j)`, now and target counted from the job's own submission `s_j` (the paper's
   finish-time fairness: time in the system over time alone, at the fair share), so that a
   job's ratio depends on neither where the clock starts nor on any other job. The reference
   counts every job from the simulation's start; the daemon's clock is Unix time, against which
   every ratio was 1 (until 2026-11-28). From 2026-11-28 to 2026-11-29 they counted from the
   submission of the oldest job the policy held, which a job held for an hour or a day (a long
   run, a long wait) turns into the same flat ratios: `docs/shockwave.md`, "Each ratio from its
   own job's submission". The FTF bounds below bound the same ratio (with `rhomax` 1 they
   are what they were with any origin).
4. The chosen rounds per job are laid out in the window's rounds, each round holding only what
   `placement` can place on the snapshot's nodes, in priority order: jobs behind target that
   cannot fit beside the jobs planned for every round first, then those, then highest priority
   (then highest rho), each on the earliest block of consecutive rounds with room for its gang
   (`packing.priority_layout`). The market's capacity is aggregate, so that layout may not hold
   everything it chose: the market is then solved again with each job capped at the rounds the
   layout gives it (`MarketInput.round_cap`), and its plan is what the window holds.
   `packing.pack` lays the plan out (the priority layout when it holds the plan, else its
   longest head with the rest spread over the roomiest rounds). The re-solve's `info` says
   `uncapped_gpu_rounds` (sum of gang x rounds the first solve chose), `layout_cut_gpu_rounds`
   (what of it the layout could not hold; `capped_status`, the second solve's status, when
   there was one), `planned_gpu_rounds` (sum of gang x rounds of
   the plan), `packed_gpu_rounds` (what `pack` laid out), and `objective_placed`, the market's
   objective with each job's progress cut to the rounds it was given (`objective` is the
   solver's, before packing).
5. Work conservation for the round about to run: the plan's jobs are placed on the nodes by
   the round loop's own step (`plan_on_nodes.place_plan`: running jobs where they run, and where
   that leaves a planned gang out, running jobs moved to make room for it; a job that still cannot
   be placed is trimmed: `info` has the round's `plan_gpus` and the trimmed `plan_gpus_lost`),
   then idle GPUs go to unscheduled jobs, longest forecast remaining time first, first that
   can be placed.
If the solver yields nothing in time the planner replays the last plan (finished jobs dropped)
or, without one, schedules greedily by fairness ratio; it logs a warning either way.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from typing import Any, Callable

import numpy as np

from ...forecast import Forecast, ForecastState, forecast
from ...model import RoundPlan, Snapshot
from ...node_book import NodeBook, holds_whole_in
from ...plan_on_nodes import place_plan
from .config import ShockwaveConfig
from .fairness import FairnessSeries
from .market import MarketInput, MarketResult, exact_dot, placed_objective, solve_market
from .packing import pack, priority_layout

log = logging.getLogger(__name__)


def fairness_ratio(now_s: Any, left_s: Any, target_s: Any, submit_s: Any) -> Any:
    """Projected time in the system over the target's: `now_s` plus `left_s` (the remaining
    time at the job's fair share) less the job's submission `submit_s`, over the target
    `target_s` less the submission (at least 1e-9 s). Scalars or arrays."""
    return (now_s + left_s - submit_s) / np.maximum(target_s - submit_s, 1e-9)


def work_weights(work: np.ndarray, exponent: float) -> np.ndarray:
    """Each job's welfare weight `(median work / its work) ** exponent` (`work`: remaining
    GPU-seconds; config `work_exponent`). Work is taken at least a millionth of the median (a
    job about to end does not get an unbounded weight); all ones when the exponent is 0 or the
    median job has no work left."""
    ref = float(np.median(work)) if len(work) else 0.0
    if exponent == 0 or ref <= 0:
        return np.ones(len(work))
    out: np.ndarray = (ref / np.maximum(work, ref * 1e-6)) ** exponent
    return out


def tail_drain_rounds(gang: np.ndarray, remaining_s: np.ndarray, gpus: int, round_s: float,
                      window: int, drain_factor: float, longest_factor: float) -> float:
    """Rounds after the window beyond which the tail term charges a job's remaining time (config
    `tail_weight`): the later of two lower bounds on when the work left can end, each scaled by
    its factor, less the window (never below 0). The whole cluster's drain, sum of gang x
    remaining time over the GPUs, times `drain_factor` (config `tail_drain_factor`); the longest
    remaining time alone, times `longest_factor` (config `tail_longest_factor`)."""
    cluster_s = drain_factor * exact_dot(gang, remaining_s) / max(gpus, 1)
    longest_s = longest_factor * float(np.max(remaining_s, initial=0.0))
    return max(0.0, max(cluster_s, longest_s) / round_s - window)


def plan_gpus_for_round(snap: Snapshot, chosen: list[int], run: list[int]) -> dict[str, int]:
    """`plan_gpus`: GPUs of the jobs the stored plan lays in this round; `plan_gpus_lost`: those
    of them that could not be placed and do not run (work conservation's trim)."""
    gang = {v.job_id: v.gang_size for v in snap.jobs}
    running = set(run)
    return {"plan_gpus": sum(gang[j] for j in chosen),
            "plan_gpus_lost": sum(gang[j] for j in chosen if j not in running)}


class Shockwave:
    """Shockwave (NSDI'23): a volatile Fisher market over a window of future rounds."""

    name = "shockwave"

    def __init__(self, config: ShockwaveConfig | None = None, **overrides: Any) -> None:
        base = config or ShockwaveConfig()
        if overrides:
            base = ShockwaveConfig(**{**base.__dict__, **overrides})
        self.config = base
        self.states: dict[int, ForecastState] = {}
        self.submit: dict[int, float] = {}
        self.series: dict[int, FairnessSeries] = {}
        self.plan: list[list[int]] = []
        self.plan_round = 0
        self.last_solve_round: int | None = None
        self.solves = 0
        self._known: frozenset[int] = frozenset()

    # ------------------------------------------------------------------ the policy protocol
    def allocate(self, snapshot: Snapshot) -> RoundPlan:
        cfg = self.config
        ids = frozenset(v.job_id for v in snapshot.jobs)
        arrived, left = ids - self._known, self._known - ids
        arrival = {v.job_id: v.arrival_s for v in snapshot.jobs if v.job_id in arrived}
        for j in arrived:
            self.states[j] = ForecastState(j)
            self.submit[j] = min(arrival[j], snapshot.now)
            self.series[j] = FairnessSeries()
        for j in left:
            self.states.pop(j, None); self.submit.pop(j, None); self.series.pop(j, None)
        self._known = ids
        if not snapshot.jobs:
            return RoundPlan(frozenset(), {"resolved": False, "solve_s": 0.0, "status": "idle",
                                           "objective": 0.0, "relaxed": False})
        fc = {v.job_id: forecast(v, self.states[v.job_id]) for v in snapshot.jobs}
        offset = snapshot.round_index - self.plan_round
        resolve = (self.last_solve_round is None or bool(arrived) or bool(left)
                   or snapshot.round_index - self.last_solve_round >= cfg.resolve_every
                   or not 0 <= offset < len(self.plan))
        info: dict[str, Any] = {"resolved": resolve, "solve_s": 0.0, "status": "replay",
                      "objective": float("nan"), "relaxed": False}
        if resolve:
            info.update(self._resolve(snapshot, fc, update_series=bool(arrived or left)
                                      or self.last_solve_round is None))
            offset = snapshot.round_index - self.plan_round
        chosen = [j for j in self.plan[offset] if j in ids] if 0 <= offset < len(self.plan) else []
        key = (self._rho_key(snapshot, fc) if cfg.fill_order == "rho"
               else (lambda j: -fc[j].remaining_s))
        run = self._fill(snapshot, chosen, key)
        info.update(plan_gpus_for_round(snapshot, chosen, run))
        return RoundPlan(frozenset(run), info)

    def _rho_key(self, snap: Snapshot, fc: dict[int, Forecast]) -> Callable[[int], float]:
        N = len(snap.jobs)
        share = min(1.0, snap.gpus / N)

        def key(j: int) -> float:
            ser = self.series.get(j)
            if not ser:
                return 0.0
            tgt = ser.target(snap.round_index, self.config.momentum)
            return -float(fairness_ratio(snap.now, fc[j].remaining_s / share, tgt,
                                         self.submit[j]))
        return key

    # ------------------------------------------------------------------ one re-solve
    def _resolve(self, snap: Snapshot, fc: dict[int, Forecast],
                 update_series: bool) -> dict[str, Any]:
        cfg = self.config
        t0 = time.perf_counter()
        views = snap.jobs
        N = len(views)
        L = snap.round_s
        share = min(1.0, snap.gpus / N)
        if update_series:
            for v in views:
                f = fc[v.job_id]
                F = self.submit[v.job_id] + (f.elapsed_profile_s + f.remaining_s) / share
                self.series[v.job_id].add(snap.round_index, F)
        target = np.array([self.series[v.job_id].target(snap.round_index, cfg.momentum)
                           for v in views])
        R = np.array([fc[v.job_id].remaining_s for v in views])
        dbar = np.array([fc[v.job_id].mean_epoch_s for v in views])
        E = np.array([float(v.num_epochs) for v in views])
        e = np.array([float(fc[v.job_id].epochs_done) for v in views])
        gang = np.array([v.gang_size for v in views], dtype=np.int64)
        if cfg.progress_model == "forecast":
            # epochs after the one in progress run at the forecast's mean duration, so that
            # planned progress and forecast remaining time agree (the reference's past average
            # caps a job's useful rounds below what its forecast needs; see config)
            after = E - e - 1
            dbar = np.where(after >= 1, R / np.maximum(after, 1), dbar)
            dbar = np.maximum(dbar, 1.0)
        T = cfg.future_rounds
        submit = np.array([self.submit[v.job_id] for v in views])
        rho = fairness_ratio(snap.now, R / share, target, submit)
        weight = work_weights(R * gang, cfg.work_exponent)
        prio = np.ones(N)
        behind = rho > cfg.rhomax
        with np.errstate(over="ignore"):
            prio[behind] = np.where(R[behind] < L, rho[behind] ** cfg.finish_exponent,
                                    rho[behind] ** cfg.lam)
        prio = np.minimum(prio * weight, cfg.priority_cap)
        base = dict(gang=gang, frac_done=e / E, full_rounds=E * dbar / L, remaining_rounds=R / L,
                    gpus=snap.gpus, rounds=T, k_round=cfg.k * L, tail_weight=cfg.tail_weight,
                    drain_rounds=tail_drain_rounds(gang, R, snap.gpus, L, T, cfg.tail_drain_factor,
                                                   cfg.tail_longest_factor))
        integer = cfg.integer_rounds and N <= cfg.mip_max_jobs
        deadline = t0 + cfg.time_limit_s

        inputs: list[MarketInput] = []      # the program of each solve that found a plan

        def solve(inp: MarketInput) -> MarketResult:
            result = solve_market(inp, breakpoints=cfg.log_breakpoints, log_zero=cfg.log_zero,
                                  integer=integer, gap=cfg.solver_gap,
                                  time_limit_s=deadline - time.perf_counter(),
                                  mip_time_limit_s=cfg.mip_time_limit_s)
            if result.ok:
                inputs.append(inp)
            return result

        def run(priority: np.ndarray, f_lower: np.ndarray) -> MarketResult:
            return solve(MarketInput(priority=priority, f_lower=f_lower, **base))

        # first attempt: finish-time-fairness bounds, each job's ratio at the window's end at
        # most rhomax: r_j/share <= rhomax (F_j - s_j) - (window end - s_j)
        slack = share * (cfg.rhomax * (target - submit) - (snap.now + T * L - submit))
        f_lower = (R - slack) / np.maximum(E * dbar, 1e-9)
        need = np.ceil(E * dbar / L * np.maximum(f_lower, 0) - 1e-9)
        trivially_infeasible = (np.any(slack < 0) or np.any(f_lower > 1 - e / E + 1e-9)
                                or np.any(need > T) or exact_dot(gang, need) > snap.gpus * T)
        relaxed = True
        res = MarketResult("infeasible", None, None, float("nan"), 0.0)
        if not trivially_infeasible:
            res = run(np.minimum(weight, cfg.priority_cap), np.maximum(f_lower, 0.0))
            relaxed = not res.ok
        if relaxed:
            res = run(prio, np.zeros(N))
        status = res.status
        ids = [v.job_id for v in views]
        packing: dict[str, Any] = {}
        if res.ok:
            assert res.rounds is not None and res.progress is not None   # what ok means
            # Jobs behind their fairness target whose gang cannot fit beside the jobs planned
            # for every window round come before those: placed after them they would find
            # every round short of GPUs and lose all their rounds, re-solve after re-solve (a
            # short whole-cluster job behind one 1-GPU job planned for the window starved for
            # two hours on the built-in workload). Then the jobs planned for every window round
            # (placed late they would find the rounds fragmented), then by priority.
            chosen, progress = res.rounds, res.progress
            full: np.ndarray = chosen >= T
            crowded = behind & (gang > snap.gpus - int(gang[full].sum()))
            order = sorted(range(N), key=lambda i: (not crowded[i], not full[i], -prio[i],
                                                    -rho[i], ids[i]))
            rounds = {ids[i]: int(chosen[i]) for i in range(N)}
            gangs = {v.job_id: v.gang_size for v in views}
            # The market's capacity is aggregate (sum of gang x rounds <= G T): where the
            # priority layout cannot hold what it chose, solve again with each job capped at the
            # rounds that layout gives it, so that the plan is what runs (module docstring).
            laid, fits = priority_layout([ids[i] for i in order], rounds, gangs, snap.gpus, T,
                                         snap.nodes, snap.reserved, snap.allowed_nodes,
                                         snap.node_counts)
            cap = np.array([fits[j] for j in ids], dtype=float)
            cut = int(exact_dot(gang, chosen - cap))
            packing["uncapped_gpu_rounds"] = int(exact_dot(gang, chosen))
            if cut > 0:
                again = solve(dataclasses.replace(inputs[-1], round_cap=cap))
                if again.rounds is not None and again.progress is not None:
                    res, chosen, progress = again, again.rounds, again.progress
                    rounds = {ids[i]: int(chosen[i]) for i in range(N)}
                packing["capped_status"] = again.status
            packing["layout_cut_gpu_rounds"] = cut
            # The priority layout is the plan when it holds every round chosen (`pack` would
            # lay it out again); otherwise `pack` keeps that layout for as long a head of the
            # order as it can and spreads the tail.
            self.plan = (laid if cut == 0 else
                         pack([ids[i] for i in order], rounds, gangs, snap.gpus, T,
                              snap.nodes, snap.reserved, snap.allowed_nodes, snap.node_counts))
            self.plan_round = snap.round_index
            placed = np.zeros(N)
            index = {j: i for i, j in enumerate(ids)}
            for rnd in self.plan:
                for j in rnd:
                    placed[index[j]] += 1
            packing.update({"planned_gpu_rounds": int(exact_dot(gang, chosen)),
                            "packed_gpu_rounds": int(exact_dot(gang, placed)),
                            "objective_placed": placed_objective(
                                inputs[-1], progress, placed,
                                breakpoints=cfg.log_breakpoints, log_zero=cfg.log_zero)})
        else:
            status = f"fallback:{status}"
            offset = snap.round_index - self.plan_round
            replay = 0 <= offset < len(self.plan)
            if not replay:
                order = sorted(range(N), key=lambda i: (-rho[i], ids[i]))
                self.plan = [[ids[i] for i in order]]   # the work-conserving fill trims it
                self.plan_round = snap.round_index
            log.warning("shockwave: no market solution (%s, %d jobs); %s", res.status, N,
                        "replaying the last plan" if replay else "greedy by fairness ratio")
        self.last_solve_round = snap.round_index
        self.solves += 1
        if log.isEnabledFor(logging.DEBUG):
            planned = Counter(j for rnd in self.plan for j in rnd)
            log.debug("shockwave: re-solve at %.1f s, round %d (%s): %s", snap.now,
                      snap.round_index, status, explain(
                          ids, gang=gang, epochs_done=e, epochs=E, remaining_s=R, rho=rho,
                          target_in_s=target - snap.now, weight=weight, priority=prio,
                          window_rounds=np.array([planned[j] for j in ids])))
        return {"resolved": True, "solve_s": time.perf_counter() - t0, "status": status,
                "objective": res.objective, "relaxed": relaxed, **packing}

    # ------------------------------------------------------------------ work conservation
    @staticmethod
    def _fill(snap: Snapshot, chosen: list[int], key: Callable[[int], float]) -> list[int]:
        """The plan's jobs as the round loop will place them (`place_plan`: running jobs
        where they run, others around them, and where that leaves a planned gang out, running
        jobs displaced for it), then idle GPUs to others in `key` order while a gang can still
        be placed."""
        gang = {v.job_id: v.gang_size for v in snap.jobs}
        placed = place_plan(RoundPlan(frozenset(chosen), {}), snap).placement
        run = [j for j in chosen if j in placed]
        book = NodeBook(snap.cluster_nodes, snap.reserved)
        for j in run:
            book.take_at(placed[j], holds_whole_in(book, snap, j, placed[j]))
        if book.free_gpus > 0:
            taken = set(run)
            others = sorted((v.job_id for v in snap.jobs if v.job_id not in taken),
                            key=key)
            for j in others:
                if book.take(gang[j], prefer=snap.home(j), within=snap.allowed_nodes.get(j),
                             spread=snap.parts(j)) is not None:
                    run.append(j)
                if book.free_gpus <= 0:
                    break
        return run


def explain(ids: list[int], **columns: np.ndarray) -> str:
    """One re-solve's inputs and plan, a job after another ("job 7: gang=4 rho=1.02 ..."), for
    the debug log: what a live decision can be taken apart with afterwards."""
    return "; ".join(f"job {j}: " + " ".join(f"{name}={float(col[i]):.4g}"
                                               for name, col in columns.items())
                     for i, j in enumerate(ids))
