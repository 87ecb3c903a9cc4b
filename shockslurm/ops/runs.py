"""The two thin adapters from a run to the plain data of `ops.plots`: a `SimResult` in memory,
or a run read back from the store (simulated or live).

What the store has for each kind of run:
- simulated (`shockslurm simulate --db`): rounds with their plan (GPUs = gang size), job specs,
  and per job a `completed` event whose detail holds the exclusive runtime (`record_simulation`),
  so rho is recomputed exactly as the simulator's metric.
- live (the daemon): rounds and plans, and a `completed` event per job that COMPLETED while the
  daemon ran (`StoreJournal.job_ended`: Slurm's end time, and the exclusive runtime the daemon
  assumed from the job's spec), so rho uses the same formula with the declared runtime. Jobs
  that ended while no daemon ran get a `finished` event at the next start, without a rho.

Bar widths: a round lasts until the next round starts; a job that completes inside a round holds
its GPUs only until its completion; the last round ends at its jobs' last completion when known,
else after the configured round length.
"""

from __future__ import annotations

import json
from typing import Mapping, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..model import JobSpec
from ..policies import PolicySettings
from ..sim.run import SimResult
from ..store.models import Job, JobEvent, PlanEntry, Round, Run
from ..store.repository import REGISTRY_KIND
from .plots import RunSeries, TimelineBar, UtilStep

COMPLETED = "completed"     # job event kind written by record_simulation (and, later, the daemon)


def static_rho(jct_s: float, exclusive_s: float, trace_jobs: int, gpus: int) -> float:
    """The simulator's rho (`sim.metrics.static_rho`): JCT / (exclusive * max(1, N / G))."""
    return jct_s / (exclusive_s * max(1.0, trace_jobs / gpus))


def _bars(rounds: Sequence[tuple[float, Mapping[str, int]]], completion: Mapping[str, float],
          gang: Mapping[str, int], last_round_s: float) -> tuple[list[TimelineBar], list[float]]:
    """Bars from (round start, {job label: GPUs}) in time order; also each round's end."""
    bars: list[TimelineBar] = []
    ends: list[float] = []
    for i, (start, plan) in enumerate(rounds):
        if i + 1 < len(rounds):
            end = rounds[i + 1][0]
        else:
            done = [completion[j] for j in plan if j in completion and completion[j] > start]
            end = max(done) if done else start + last_round_s
        ends.append(end)
        for job, gpus in plan.items():
            stop = min(end, completion.get(job, end))
            if stop > start:
                bars.append((job, start, stop - start, gang.get(job, gpus)))
    return bars, ends


def from_sim(result: SimResult, jobs: Sequence[JobSpec], label: str | None = None) -> RunSeries:
    """A simulated run straight from its `SimResult` (`shockslurm simulate --plot`)."""
    gang = {f"job {s.job_id}": s.gang_size for s in jobs}
    completion = {f"job {o.job_id}": o.completion_s for o in result.outcomes}
    rounds = [(r.start_s, {f"job {j}": gang[f"job {j}"] for j in r.run}) for r in result.rounds]
    bars, _ = _bars(rounds, completion, gang, result.config.round_s)
    gpus = result.config.gpus
    util = [(r.start_s, r.gpus_used, gpus) for r in result.rounds]
    rho = [static_rho(o.jct_s, o.exclusive_runtime_s, len(jobs), gpus) for o in result.outcomes
           if o.exclusive_runtime_s > 0]
    return RunSeries(label or result.policy, result.policy, bars, util, rho)


def run_ids(session: Session, wanted: Sequence[int] = ()) -> list[int]:
    """The runs to report: `wanted`, or every simulated/live run (not the shocksub registry)."""
    if wanted:
        found = set(session.scalars(select(Run.id).where(Run.id.in_(list(wanted)))))
        missing = [r for r in wanted if r not in found]
        if missing:
            raise LookupError(f"no run {', '.join(map(str, missing))} in the store")
        return list(wanted)
    return list(session.scalars(select(Run.id).where(Run.kind != REGISTRY_KIND)
                                .order_by(Run.id)))


def from_store(session: Session, run_id: int) -> RunSeries:
    """A stored run (reads its rounds, plan entries, jobs and completion events)."""
    run = session.get(Run, run_id)
    if run is None:
        raise LookupError(f"no run {run_id} in the store")
    cfg = dict(run.config or {})
    jobs = {j.id: j for j in session.scalars(select(Job).where(Job.run_id == run_id))}
    label_of = {pk: f"job {j.job_id}" for pk, j in jobs.items()}
    gang = {label_of[pk]: j.gang_size for pk, j in jobs.items()}
    rounds_rows = list(session.scalars(select(Round).where(Round.run_id == run_id)
                                       .order_by(Round.round_index)))
    plans: dict[int, dict[str, int]] = {r.id: {} for r in rounds_rows}
    for entry in session.scalars(select(PlanEntry).join(Round, PlanEntry.round_id == Round.id)
                                 .where(Round.run_id == run_id)):
        plans[entry.round_id][label_of[entry.job_pk]] = entry.gpus
    completion: dict[str, float] = {}
    exclusive: dict[str, float] = {}
    events = session.scalars(select(JobEvent).join(Job, JobEvent.job_pk == Job.id)
                             .where(Job.run_id == run_id, JobEvent.kind == COMPLETED))
    for ev in events:
        label = label_of[ev.job_pk]
        completion[label] = ev.time_s
        try:
            detail = json.loads(ev.detail or "{}")
            exclusive[label] = float(detail["exclusive_runtime_s"])
        except (ValueError, KeyError, TypeError):
            pass
    round_s = float(cfg.get("round_s") or cfg.get("round_seconds")
                    or PolicySettings.round_s)
    rounds = [(r.time_s, plans[r.id]) for r in rounds_rows]
    bars, _ = _bars(rounds, completion, gang, round_s)
    used = [sum(plan.values()) for _, plan in rounds]
    total = int(cfg.get("gpus") or max(used, default=0) or 1)  # live runs: peak GPUs in use
    util: list[UtilStep] = [(t, u, total) for (t, _), u in zip(rounds, used)]
    trace_jobs = int(cfg.get("jobs") or len(jobs) or 1)
    submit = {label_of[pk]: j.submit_s for pk, j in jobs.items()}
    rho = [static_rho(completion[k] - submit[k], exclusive[k], trace_jobs, total)
           for k in sorted(completion) if exclusive.get(k, 0) > 0]
    return RunSeries(f"run {run_id} {run.policy}", run.policy, bars, util, rho)

