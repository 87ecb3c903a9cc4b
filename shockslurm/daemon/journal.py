"""The daemon's memory in the SQL store: `StoreJournal` implements the live cluster's `Journal`
(rounds, plan entries, an intent before every Slurm call and its outcome after), its
`SpecRegistry` (specs registered by `shocksub --db`) and `StopLedger` (stops under way and past
preemptions, for crash safety and churn bounds), and reconciles the store with Slurm at start.

Only `daemon/` wires it; `live/` and `slurm/` never import the store.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
from typing import Any, Iterable, Mapping, Sequence, cast

from sqlalchemy import Engine, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from ..model import RoundPlan, Snapshot
from ..live import enact as en
from ..live.acting import OUTCOME_UNKNOWN_RE
from ..live.stops import STOP_ENDS, maybe_sent, under_way
from ..live.journaling import JournalUnavailable, LiveJob
from ..live.specs import epoch_seconds
from ..slurm.types import CommandResult, JobState, SlurmJob
from ..store.models import stamp_seconds

log = logging.getLogger("shockslurm.daemon")

RC_UNKNOWN = -2                 # an intent's outcome, unknown: the daemon died during the call
UNKNOWN_OUTCOME = "unknown (daemon restarted)"


def _store(what: str):
    """Decorator: SQLAlchemy errors of a journal method become `JournalUnavailable`."""
    def wrap(fn):
        def inner(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except SQLAlchemyError as exc:
                raise JournalUnavailable(f"the store cannot {what}: {type(exc).__name__}: "
                                         f"{str(exc).splitlines()[0] if str(exc) else ''}"
                                         ) from exc
        inner.__name__ = fn.__name__
        inner.__doc__ = fn.__doc__
        return inner
    return wrap


# --------------------------------------------------------------------------- the store
# job events that say a job left the queue (at most one per job row)
ENDED_KINDS = ("completed", "finished", "vanished")

class StoreJournal:
    """`slurm.journaling.Journal` + `SpecRegistry` + `RoundObserver` on the SQL store.

    One transaction per write, committed before the Slurm call it describes, so a crash between
    the two leaves an intent without an outcome (visible, never silently lost).

    Construction touches nothing: the run row (its config records this process's `host` and
    `pid`, so every intent is traceable to the process that made it) is written by the first
    `reconcile` or `begin_round`, i.e. under the daemon's outage handling and only once the
    daemon leads.
    """

    def __init__(self, engine: Engine, *, cluster: str, policy: str,
                 config: Mapping[str, Any] | None = None) -> None:
        from ..store import repository as repo

        self.repo = repo
        self.engine = engine
        self.cluster = cluster
        self.config = {**dict(config or {}), "host": socket.gethostname(), "pid": os.getpid()}
        self.run_id: int | None = None
        self.policy = policy
        self._job_pk: dict[tuple[int, float], int] = {}
        self._jobs: Mapping[int, LiveJob] = {}
        self._round_id: int | None = None
        self._config_changed = False        # since the run row was written

    def reconfigure(self, config: Mapping[str, Any]) -> None:
        """The configuration a reload applied: the run row takes it with the next round."""
        new = {**dict(config), "host": self.config["host"], "pid": self.config["pid"]}
        self._config_changed = self._config_changed or new != self.config
        self.config = new

    def _ensure_run(self) -> None:
        """Write this daemon's run row, once (outside any other transaction of ours)."""
        if self.run_id is None:
            with Session(self.engine) as s, s.begin():
                self.run_id = self.repo.add_run(s, policy=self.policy, kind="live",
                                                cluster=self.cluster, config=self.config).id

    def _pk(self, s: Session, job_id: int) -> int | None:
        live = self._jobs.get(job_id)
        if live is None:
            return None
        key = (job_id, live.slurm.submit_time)
        if key not in self._job_pk:
            spec = live.spec
            run = s.get_one(self.repo.Run, self.run_id)
            job = self.repo.add_job(s, run, job_id=job_id, submit_s=live.slurm.submit_time,
                                    model=spec.model, epochs=spec.epochs,
                                    samples_per_epoch=spec.samples_per_epoch,
                                    batch_sizes=spec.batch_sizes, gang_size=live.slurm.gpus,
                                    owner=live.slurm.user or None)
            self._job_pk[key] = job.id
        return self._job_pk[key]

    # SpecRegistry
    @_store("look up registered specs")
    def lookup(self, jobs: Sequence[SlurmJob]) -> Mapping[int, Mapping[str, object]]:
        with Session(self.engine) as s:
            found = self.repo.registered_jobs(s, self.cluster,
                                              {j.job_id: j.submit_time for j in jobs})
            # as stored: the live cluster validates each (`specs.spec_from_mapping`), so a bad
            # registration (any JSON in batch_sizes) is that job's problem, not a store outage
            return {jid: {"model": j.model, "epochs": j.epochs,
                          "samples_per_epoch": j.samples_per_epoch,
                          "batch_sizes": j.batch_sizes} for jid, j in found.items()}

    # Journal
    @_store("record the round")
    def begin_round(self, snapshot: Snapshot, plan: RoundPlan,
                    jobs: Mapping[int, LiveJob]) -> None:
        self._jobs = jobs
        # the store keys of the jobs this round may name, no others: the cache would otherwise
        # hold every job the daemon ever journalled (a job seen again is found by `add_job`)
        live = {(job_id, j.slurm.submit_time) for job_id, j in jobs.items()}
        self._job_pk = {k: pk for k, pk in self._job_pk.items() if k in live}
        self._ensure_run()
        with Session(self.engine) as s, s.begin():
            run = s.get_one(self.repo.Run, self.run_id)
            if self._config_changed:
                run.config = dict(self.config)
            entries = {}
            for job_id in sorted(plan.run):
                pk = self._pk(s, job_id)
                if pk is not None:
                    entries[s.get_one(self.repo.Job, pk)] = jobs[job_id].slurm.gpus
            status = plan.info.get("status")
            objective = plan.info.get("objective")
            idle = plan.info.get("idle_gpu_s")        # the live cluster's, by cause
            rnd = self.repo.record_round(
                s, run, index=snapshot.round_index, time_s=snapshot.now, policy=self.policy,
                solve_s=0.0, plan=entries, status=None if status is None else str(status),
                objective=float(objective) if isinstance(objective, (int, float)) else None,
                idle_gpu_s=idle if isinstance(idle, Mapping) else None)
            s.flush()
            self._round_id = rnd.id
        self._config_changed = False        # committed

    @_store("record an intent")
    def intent(self, step: en.Step) -> object:
        with Session(self.engine) as s, s.begin():
            rnd = s.get_one(self.repo.Round, self._round_id)
            ids = []
            for job_id in step.job_ids:
                pk = self._pk(s, job_id)
                if pk is None:   # never act on a job without its intent recorded first
                    raise LookupError(f"job {job_id} is not known to this round's journal")
                intent = self.repo.add_enactment_intent(s, rnd, s.get_one(self.repo.Job, pk),
                                                        action=step.action, argv=step.argv)
                ids.append(intent.id)
            return ids

    @_store("record an outcome")
    def outcome(self, handle: object, result: CommandResult) -> None:
        with Session(self.engine) as s, s.begin():
            for intent_id in cast("list[int]", handle or []):   # what `intent` returned
                intent = s.get_one(self.repo.EnactmentIntent, intent_id)
                self.repo.finish_enactment_intent(s, intent, return_code=result.returncode,
                                                  stderr=result.stderr)

    @_store("record a job's end")
    def job_ended(self, job: LiveJob, final: SlurmJob | None, now: float) -> None:
        """A `completed` event (time: Slurm's end time; detail: the exclusive run time the
        daemon assumed, so reports compute rho as for a simulation) on this run's row of a job
        that COMPLETED, a `finished` event (its state) for any other end, `vanished` when Slurm
        no longer knows it. A job restarted later gets new events only with a new submission."""
        slurm = final or job.slurm
        if final is None:
            kind = "vanished"
        else:
            kind = "completed" if final.state is JobState.COMPLETED else "finished"
        detail: dict[str, object] = {
            "state": None if final is None else final.state.value,
            "exclusive_runtime_s": epoch_seconds(job.spec, max(1, slurm.gpus)) * job.spec.epochs,
            "run_time_s": round(job.run_time_s, 3), "seen_by": "daemon"}
        end = final.end_time if final is not None and final.end_time else now
        with Session(self.engine) as s, s.begin():
            pk = self._pk(s, slurm.job_id)
            if pk is not None:
                self.repo.add_job_event_once(s, pk, time_s=end, kind=kind,
                                             detail=json.dumps(detail), unless=ENDED_KINDS)

    # RoundObserver
    def on_round(self, snapshot: Snapshot, plan: RoundPlan, solve_s: float) -> None:
        if self._round_id is not None:
            try:
                with Session(self.engine) as s, s.begin():
                    self.repo.set_round_solve_s(s, self._round_id, solve_s)
            except SQLAlchemyError as exc:   # bookkeeping only
                log.warning("could not record the solve time (%s)", type(exc).__name__)

    # StopLedger
    def _live_rows(self, s: Session, jobs: Mapping[int, float]) -> Any:
        """Intents of the live runs of this cluster on the Slurm jobs {job id: submit time}."""
        return s.execute(self.live_rows_query(jobs))

    def live_rows_query(self, jobs: Iterable[int]) -> Any:
        """`_live_rows`' query: by the jobs' Slurm ids and the intents' job keys, both indexed
        (revision 0005), so a round reads its jobs' intents, not the whole history."""
        r = self.repo
        return (select(r.Job.job_id, r.Job.submit_s, r.EnactmentIntent)
                .join(r.Run, r.Job.run_id == r.Run.id)
                .join(r.EnactmentIntent, r.EnactmentIntent.job_pk == r.Job.id)
                .where(r.Run.kind == "live", r.Run.cluster == self.cluster,
                       r.Job.job_id.in_(list(jobs)))
                .order_by(r.EnactmentIntent.created_at, r.EnactmentIntent.id))

    @_store("read the daemon's earlier holds")
    def last_hold_commands(self, jobs: Sequence[SlurmJob]) -> dict[int, tuple[str, ...]]:
        """Each of `jobs`' latest done hold, release or requeuehold in this cluster's live runs,
        as its command (`("scontrol", "uhold")`...): whose the hold a job shows now is. After a
        `release`, a hold is someone else's; `("scontrol", "hold")` is the administrator's hold
        daemons before 2026-11-29 held with."""
        wanted = {j.job_id: j.submit_time for j in jobs}
        if not wanted:
            return {}
        latest: dict[int, tuple[str, ...]] = {}
        with Session(self.engine) as s:
            for job_id, submit_s, intent in self._live_rows(s, wanted):   # oldest first
                if submit_s == wanted.get(job_id) and intent.return_code == 0 and \
                        intent.action in ("hold", "release", "requeuehold"):
                    latest[job_id] = tuple(intent.argv[:2])
        return latest

    @_store("read the first submit times")
    def first_submits(self, jobs: Sequence[SlurmJob]) -> Mapping[int, float]:
        """The submit time each requeued job of `jobs` was first seen with, from earlier
        daemons' rows or, for a job requeued while none ran, its registration
        (`repository.first_submit_times`). Jobs never requeued are left out."""
        with Session(self.engine) as s:      # connects only when a job was requeued
            return self.repo.first_submit_times(s, self.cluster, jobs)

    @_store("read the stops under way")
    def pending_stops(self, jobs: Sequence[SlurmJob]) -> Mapping[int, float]:
        wanted = {j.job_id: j.submit_time for j in jobs}
        if not wanted:
            return {}
        by_id = {j.job_id: j for j in jobs}
        since: dict[int, float | None] = {}
        with Session(self.engine) as s:
            for job_id, submit_s, intent in self._live_rows(s, wanted):
                if submit_s != wanted.get(job_id):
                    continue
                t = stamp_seconds(intent.created_at)
                if intent.action == "signal":
                    outcome = _signal_outcome(intent.return_code, intent.stderr or "", job_id)
                    if outcome == "sent" or (outcome == "maybe"
                                             and maybe_sent(by_id[job_id], t)):
                        since[job_id] = t
                elif intent.action == "requeuehold" and intent.return_code == 0:
                    since[job_id] = None
        return {j: t for j, t in since.items() if t is not None}

    @_store("record a job event")
    def job_event(self, job: SlurmJob, kind: str, detail: Mapping[str, object],
                  now: float) -> None:
        """On the job's registration when it has one, else on this run's row for it."""
        with Session(self.engine) as s, s.begin():
            row = self.repo.registered_jobs(s, self.cluster, {job.job_id: job.submit_time}
                                            ).get(job.job_id)
            if row is None:
                pk = self._pk(s, job.job_id)
                row = s.get(self.repo.Job, pk) if pk is not None else None
            if row is not None:
                self.repo.add_job_event_once(s, row.id, time_s=now, kind=kind,
                                             detail=json.dumps(dict(detail)))

    # start-up reconciliation
    @_store("reconcile")
    def reconcile(self, slurm_jobs: Sequence[SlurmJob], now: float) -> dict[str, int]:
        """Give the intents earlier incarnations left open an outcome from Slurm's state, and
        the jobs they knew that Slurm shows finished (or no longer knows) a job event; not a
        job whose stop is under way (it exited on its USR1 and is about to be requeued)."""
        self._ensure_run()
        r = self.repo
        by_key = {(j.job_id, j.submit_time): j for j in slurm_jobs}
        # a job that ended on its USR1 shows COMPLETED (or FAILED) until the resumed stop
        # requeues it (the stops it will resume: `stops.under_way`, as the cluster decides)
        ends = {j.job_id: j for j in slurm_jobs if j.state in STOP_ENDS}
        grace_s = float(self.config.get("grace_seconds", math.inf))
        stopping = {job_id for job_id, since in self.pending_stops(list(ends.values())).items()
                    if under_way(ends[job_id], since, grace_s)}
        counts = {"resolved_done": 0, "resolved_unknown": 0, "finished": 0, "vanished": 0}
        with Session(self.engine) as s, s.begin():
            open_rows = s.execute(
                select(r.Job, r.EnactmentIntent)
                .join(r.Run, r.Job.run_id == r.Run.id)
                .join(r.EnactmentIntent, r.EnactmentIntent.job_pk == r.Job.id)
                .where(r.Run.kind == "live", r.Run.cluster == self.cluster,
                       r.Run.id != self.run_id, r.EnactmentIntent.return_code.is_(None)))
            for job, intent in open_rows:
                sj = by_key.get((job.job_id, job.submit_s))
                done, state = _intent_done(intent.action, sj, stamp_seconds(intent.created_at))
                rc = 0 if done else RC_UNKNOWN
                r.finish_enactment_intent(
                    s, intent, return_code=rc,
                    stderr=f"{UNKNOWN_OUTCOME}: {'done' if done else 'not known to be done'}"
                           f"; Slurm now shows the job {state}")
                counts["resolved_done" if done else "resolved_unknown"] += 1
            ended = select(r.JobEvent.job_pk).where(r.JobEvent.kind.in_(ENDED_KINDS))
            rows = s.scalars(select(r.Job).join(r.Run, r.Job.run_id == r.Run.id)
                             .where(r.Run.kind == "live", r.Run.cluster == self.cluster,
                                    r.Run.id != self.run_id, r.Job.id.not_in(ended))
                             .order_by(r.Job.id))
            for job in rows:
                sj = by_key.get((job.job_id, job.submit_s))
                if sj is not None and (not sj.state.finished or sj.job_id in stopping):
                    continue
                kind = "vanished" if sj is None else "finished"
                detail = {"state": None if sj is None else sj.state.value,
                          "seen_by": UNKNOWN_OUTCOME}
                r.add_job_event(s, job, time_s=now, kind=kind, detail=json.dumps(detail))
                counts[kind] += 1
        return counts


def _signal_outcome(rc: int | None, stderr: str, job_id: int) -> str:
    """A USR1 intent's outcome for job `job_id`: "failed" (a failure that names the job, or
    names none), "maybe" (the call timed out: it may have gone out, `stops.maybe_sent`), else
    "sent"."""
    if rc in (None, 0, RC_UNKNOWN):
        return "sent"
    if OUTCOME_UNKNOWN_RE.search(stderr):
        return "maybe"
    named = en.unsignalled(stderr)
    return "failed" if job_id in named or not named else "sent"


def _intent_done(action: str, job: SlurmJob | None, at: float) -> tuple[bool, str]:
    """Whether Slurm's current state shows that an intent of `action` made at `at` was done,
    and that state in words."""
    if job is None:
        return False, "gone (no longer in squeue)"
    state = job.state.value + (" held" if job.held else "") + \
        f" restart_count={job.restart_count}"
    restarted_after = job.start_time is None or job.start_time > at + 1.0
    if action == "requeuehold":
        return (job.state is JobState.PENDING and (job.held or job.restart_count > 0)), state
    if action == "hold":
        return job.held, state
    if action == "release":
        return (job.state is JobState.RUNNING or
                (job.state is JobState.PENDING and not job.held)), state
    if action == "signal":     # a signal leaves no trace; the stop resumes from the store
        return (job.state is JobState.PENDING and job.restart_count > 0
                and restarted_after), state
    return False, state
