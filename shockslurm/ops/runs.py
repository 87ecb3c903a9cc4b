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
import math
from typing import Mapping, Sequence

from sqlalchemy import Text, select, type_coerce
from sqlalchemy.orm import Session

from ..errors import ShockslurmError
from ..limits import finite, is_real
from ..model import MAX_CLUSTER_GPUS, JobSpec
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


# A run id is a SQL INTEGER/BIGINT: 1 .. 2^63 - 1 (ids outside it are no run, and would
# overflow the driver).
MAX_RUN_ID = 2**63 - 1


class RunDamaged(ShockslurmError, LookupError):
    """A stored run `report` cannot draw: a value in its rows is not what the store writes (a
    hand edit, a damaged file). The message names the run, the table, the row and the value. A
    `LookupError`, as "no such run" is, so a command reporting runs shows it as one line."""


class _Bad(Exception):
    """What is wrong, without the run (from_store adds it)."""


def run_ids(session: Session, wanted: Sequence[int] = ()) -> list[int]:
    """The runs to report: `wanted`, or every simulated/live run (not the shocksub registry)."""
    if wanted:
        outside = [r for r in wanted if not 1 <= r <= MAX_RUN_ID]
        if outside:
            raise LookupError(f"no run {', '.join(map(str, outside))} in the store (run ids are "
                              f"1 to {MAX_RUN_ID})")
        found = set(session.scalars(select(Run.id).where(Run.id.in_(list(wanted)))))
        missing = [r for r in wanted if r not in found]
        if missing:
            raise LookupError(f"no run {', '.join(map(str, missing))} in the store")
        return list(wanted)
    return list(session.scalars(select(Run.id).where(Run.kind != REGISTRY_KIND)
                                .order_by(Run.id)))


def from_store(session: Session, run_id: int) -> RunSeries:
    """A stored run (reads its rounds, plan entries, jobs and completion events).

    `LookupError` when there is no such run; `RunDamaged` (a `LookupError`) when a value it
    needs is not what the store writes: a run's configuration that is no JSON object or has a
    non-numeric `gpus`/`jobs`/`round_s`, a time, gang size or GPU count that is no number, a
    plan entry of a job that is not the run's. That run is not drawn (`report` names it and the
    row, and draws the others) rather than drawn silently wrong. Events' details are read
    leniently: one that does not parse gives no rho.
    """
    if not 1 <= run_id <= MAX_RUN_ID:
        raise LookupError(f"no run {run_id} in the store (run ids are 1 to {MAX_RUN_ID})")
    row = session.execute(select(Run.policy, type_coerce(Run.config, Text))
                          .where(Run.id == run_id)).first()
    if row is None:
        raise LookupError(f"no run {run_id} in the store")
    try:
        return _read_run(session, run_id, row[0], _config(row[1]))
    except _Bad as exc:
        raise RunDamaged(f"run {run_id} cannot be reported: damaged in the store: {exc}") from None


def _config(raw: object) -> dict[str, object]:
    """runs.config as a dict (SQLite hands back its text; PostgreSQL's driver may parse it)."""
    if isinstance(raw, (str, bytes)):
        try:
            raw = json.loads(raw)
        except (ValueError, RecursionError):
            raise _Bad(f"runs.config is not JSON: {_short(raw)}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _Bad(f"runs.config is not a JSON object: {_short(raw)}")
    return raw


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _number(value: object, where: str) -> float:
    """A finite number read from the store, else `_Bad` naming `where`."""
    if not is_real(value):
        raise _Bad(f"{where} is {_short(value)}, not a number")
    number = finite(value)
    if number is None:
        raise _Bad(f"{where} is {_short(value)}, not a finite number")
    return number


def _count(value: object, where: str, *, minimum: int = 1,
           maximum: int | None = MAX_CLUSTER_GPUS) -> int:
    """A whole number in `minimum`..`maximum` read from the store (a run's configuration may
    hold "4"); a count of GPUs by default, at most the largest cluster the model takes."""
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            pass
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (
            maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum:,}"
        raise _Bad(f"{where} is {_short(value)}, not a whole number {bound}")
    return value


def _setting(cfg: Mapping[str, object], *keys: str) -> object:
    """The first of `keys` set (truthy) in the run's configuration, and None if none is."""
    return next((cfg[k] for k in keys if cfg.get(k)), None)


def _read_run(session: Session, run_id: int, policy: str, cfg: Mapping[str, object]) -> RunSeries:
    jobs = _jobs(session, run_id)
    label_of = {pk: f"job {job_id}" for pk, (job_id, _, _) in jobs.items()}
    gang = {label_of[pk]: g for pk, (_, g, _) in jobs.items()}
    rounds = _rounds(session, run_id, label_of)
    completion, exclusive = _completions(session, run_id, label_of)
    given = _setting(cfg, "round_s", "round_seconds")
    round_s = PolicySettings.round_s if given is None else _number(given, "runs.config round_s")
    bars, _ = _bars(rounds, completion, gang, round_s)
    used = [sum(plan.values()) for _, plan in rounds]
    gpus = _setting(cfg, "gpus")
    total = (_count(gpus, "runs.config gpus") if gpus is not None
             else max(used, default=0) or 1)          # live runs: peak GPUs in use
    util: list[UtilStep] = [(t, u, total) for (t, _), u in zip(rounds, used)]
    declared = _setting(cfg, "jobs")
    trace_jobs = (_count(declared, "runs.config jobs", maximum=None) if declared is not None
                  else len(jobs) or 1)
    submit = {label_of[pk]: s for pk, (_, _, s) in jobs.items()}
    rho = [static_rho(completion[k] - submit[k], exclusive[k], trace_jobs, total)
           for k in sorted(completion) if exclusive.get(k, 0) > 0]
    return RunSeries(f"run {run_id} {policy}", policy, bars, util, rho)


def _jobs(session: Session, run_id: int) -> dict[int, tuple[object, int, float]]:
    """job pk -> (job id, gang size, submit time)."""
    out: dict[int, tuple[object, int, float]] = {}
    for pk, job_id, gang, submit in session.execute(
            select(Job.id, Job.job_id, Job.gang_size, Job.submit_s).where(Job.run_id == run_id)):
        out[pk] = (job_id, _count(gang, f"jobs row {pk} gang_size"),
                   _number(submit, f"jobs row {pk} submit_s"))
    return out


def _rounds(session: Session, run_id: int,
            label_of: Mapping[int, str]) -> list[tuple[float, dict[str, int]]]:
    """(round start, {job label: GPUs}) in round order."""
    rows = session.execute(select(Round.id, Round.time_s).where(Round.run_id == run_id)
                           .order_by(Round.round_index)).all()
    plans: dict[int, dict[str, int]] = {pk: {} for pk, _ in rows}
    entries = session.execute(select(PlanEntry.id, PlanEntry.round_id, PlanEntry.job_pk,
                                     PlanEntry.gpus)
                              .join(Round, PlanEntry.round_id == Round.id)
                              .where(Round.run_id == run_id))
    for pk, round_pk, job_pk, gpus in entries:
        if job_pk not in label_of:
            raise _Bad(f"plan_entries row {pk} (round row {round_pk}) names job_pk "
                       f"{_short(job_pk)}, which is no job of this run")
        plans[round_pk][label_of[job_pk]] = _count(gpus, f"plan_entries row {pk} gpus",
                                                   minimum=0)
    return [(_number(t, f"rounds row {pk} time_s"), plans[pk]) for pk, t in rows]


def _completions(session: Session, run_id: int,
                 label_of: Mapping[int, str]) -> tuple[dict[str, float], dict[str, float]]:
    """Per job label: its completion time, and its exclusive runtime where the event has it."""
    completion: dict[str, float] = {}
    exclusive: dict[str, float] = {}
    events = session.execute(select(JobEvent.id, JobEvent.job_pk, JobEvent.time_s,
                                    JobEvent.detail)
                             .join(Job, JobEvent.job_pk == Job.id)
                             .where(Job.run_id == run_id, JobEvent.kind == COMPLETED))
    for pk, job_pk, time_s, detail in events:
        label = label_of[job_pk]
        completion[label] = _number(time_s, f"job_events row {pk} time_s")
        try:
            runtime = float(json.loads(detail or "{}")["exclusive_runtime_s"])
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError):
            continue
        if math.isfinite(runtime):
            exclusive[label] = runtime
    return completion, exclusive
