"""The store's writers and a few readers: small functions over a `Session`.

Why functions, not a DAO class: every caller (simulator run, daemon round, training-job report)
writes a handful of rows in its own transaction; the caller owns the Session and its commit.
Everything goes through the ORM, so values are always bound parameters, never SQL text.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Iterable, Mapping, NamedTuple, Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ..model import JobSpec
from .models import (BatchSizeChange, Checkpoint, EnactmentIntent, Job, JobEvent, PlanEntry,
                     Round, Run, ThroughputSample, stamp_seconds)

if TYPE_CHECKING:
    from ..slurm.types import SlurmJob


def now_utc() -> datetime:
    return datetime.now(timezone.utc)


def _finite(x: float | None) -> float | None:
    """NaN/inf become NULL: SQLite cannot store NaN and PostgreSQL would, so they would differ."""
    return None if x is None or not math.isfinite(x) else float(x)


def add_run(session: Session, *, policy: str, kind: str = "sim", cluster: str = "sim",
            config: Mapping[str, Any] | None = None, started_at: datetime | None = None) -> Run:
    run = Run(kind=kind, cluster=cluster, policy=policy, started_at=started_at or now_utc(),
              config=dict(config or {}))
    session.add(run)
    session.flush()
    return run


def add_job(session: Session, run: Run, *, job_id: int, submit_s: float, model: str, epochs: int,
            samples_per_epoch: int, batch_sizes: Sequence[int], gang_size: int,
            owner: str | None = None) -> Job:
    """The job keyed (run, job_id, submit_s), created with this spec when it is not there yet."""
    job = session.scalar(select(Job).where(Job.run_id == run.id, Job.job_id == job_id,
                                           Job.submit_s == submit_s))
    if job is None:
        job = Job(run_id=run.id, job_id=job_id, submit_s=submit_s, owner=owner, model=model,
                  epochs=epochs, samples_per_epoch=samples_per_epoch,
                  batch_sizes=[int(b) for b in batch_sizes], gang_size=gang_size)
        session.add(job)
        session.flush()
    return job


def add_job_spec(session: Session, run: Run, spec: JobSpec, owner: str | None = None) -> Job:
    """Record a `JobSpec` as declared (ladder = every batch size it may use)."""
    return add_job(session, run, job_id=spec.job_id, submit_s=spec.arrival_s, model=spec.model,
                   epochs=spec.num_epochs, samples_per_epoch=spec.samples_per_epoch,
                   batch_sizes=spec.batch_size_ladder, gang_size=spec.gang_size, owner=owner)


def add_job_event(session: Session, job: Job, *, time_s: float, kind: str,
                  detail: str | None = None) -> JobEvent:
    event = JobEvent(job_pk=job.id, time_s=time_s, kind=kind, detail=detail)
    session.add(event)
    return event


def add_job_event_once(session: Session, job_pk: int, *, time_s: float, kind: str,
                       detail: str | None = None,
                       unless: Sequence[str] | None = None) -> JobEvent | None:
    """A job event unless the job already has one of the kinds `unless` (default: `kind`);
    None when it had."""
    seen = session.scalar(select(JobEvent.id).where(
        JobEvent.job_pk == job_pk, JobEvent.kind.in_(list(unless or (kind,)))).limit(1))
    if seen is not None:
        return None
    event = JobEvent(job_pk=job_pk, time_s=time_s, kind=kind, detail=detail)
    session.add(event)
    return event


def record_round(session: Session, run: Run, *, index: int, time_s: float, policy: str,
                 solve_s: float, plan: Mapping[Job, int], status: str | None = None,
                 objective: float | None = None,
                 idle_gpu_s: Mapping[str, float] | None = None) -> Round:
    """A round and its plan (`plan` maps each running job to its GPUs); `idle_gpu_s`: idle
    GPU-seconds since the previous round by cause (switch, unplaceable, waiting)."""
    idle = idle_gpu_s or {}
    rnd = Round(run_id=run.id, round_index=index, time_s=time_s, policy=policy, solve_s=solve_s,
                status=status, objective=_finite(objective),
                idle_switch_gpu_s=_finite(idle.get("switch")),
                idle_unplaceable_gpu_s=_finite(idle.get("unplaceable")),
                idle_waiting_gpu_s=_finite(idle.get("waiting")))
    session.add(rnd)
    session.flush()
    session.add_all(PlanEntry(round_id=rnd.id, job_pk=job.id, gpus=gpus)
                    for job, gpus in plan.items())
    return rnd


def add_enactment_intent(session: Session, rnd: Round, job: Job, *, action: str,
                         argv: Sequence[str]) -> EnactmentIntent:
    """Write what is about to run before running it; `finish_enactment_intent` closes it."""
    intent = EnactmentIntent(round_id=rnd.id, job_pk=job.id, action=action,
                             argv=[str(a) for a in argv], created_at=now_utc())
    session.add(intent)
    session.flush()
    return intent


def finish_enactment_intent(session: Session, intent: EnactmentIntent, *, return_code: int,
                            stderr: str = "") -> None:
    intent.return_code = return_code
    intent.stderr = stderr
    intent.finished_at = now_utc()


def add_throughput_sample(session: Session, job_pk: int, *, time_s: float, samples_per_s: float,
                          batch_size: int, gpus: int) -> ThroughputSample:
    sample = ThroughputSample(job_pk=job_pk, time_s=time_s, samples_per_s=samples_per_s,
                              batch_size=batch_size, gpus=gpus)
    session.add(sample)
    return sample


def add_batch_size_change(session: Session, job_pk: int, *, time_s: float, old: int,
                          new: int) -> BatchSizeChange:
    change = BatchSizeChange(job_pk=job_pk, time_s=time_s, old_batch_size=old, new_batch_size=new)
    session.add(change)
    return change


def add_checkpoint(session: Session, job_pk: int, *, time_s: float, path: str, step: int,
                   ok: bool) -> Checkpoint:
    ckpt = Checkpoint(job_pk=job_pk, time_s=time_s, path=path, step=step, ok=ok)
    session.add(ckpt)
    return ckpt


def count(session: Session, model: type) -> int:
    """Rows of one table (reports and tests)."""
    return int(session.scalar(select(func.count()).select_from(model)) or 0)


def throughput_history(session: Session, job_pk: int) -> list[ThroughputSample]:
    """A job's throughput samples in time order."""
    return list(session.scalars(select(ThroughputSample).where(ThroughputSample.job_pk == job_pk)
                                .order_by(ThroughputSample.time_s, ThroughputSample.id)))


# --------------------------------------------------------------------------- live daemon
# Specs that `shocksub --db` registers live in one run per cluster of kind "registry", so the
# schema needs no new table: a Job row there is "this Slurm job was submitted with this spec".
REGISTRY_KIND = "registry"


def registry_run(session: Session, cluster: str) -> Run:
    """The cluster's registry run (created on first use)."""
    run = session.scalar(select(Run).where(Run.kind == REGISTRY_KIND, Run.cluster == cluster)
                         .order_by(Run.id).limit(1))
    if run is None:
        run = add_run(session, policy="shocksub", kind=REGISTRY_KIND, cluster=cluster)
    return run


def register_submitted_job(session: Session, cluster: str, *, job_id: int, submit_s: float,
                           model: str, epochs: int, samples_per_epoch: int,
                           batch_sizes: Sequence[int], gang_size: int,
                           owner: str | None = None, report_key: str | None = None) -> Job:
    """Record the spec of a job just submitted to Slurm (idempotent for the same key).

    `report_key` is the key its reports are verified with (`train.records.derive_key` of the
    secret handed to the job: an Ed25519 public key, or a legacy HMAC key), never the secret."""
    job = add_job(session, registry_run(session, cluster), job_id=job_id, submit_s=submit_s,
                  model=model, epochs=epochs, samples_per_epoch=samples_per_epoch,
                  batch_sizes=batch_sizes, gang_size=gang_size, owner=owner)
    if report_key is not None and job.report_key is None:
        job.report_key = report_key
    return job


def _rows_for(session: Session, cluster: str, kind: str, job_ids: Iterable[int]
              ) -> Iterable[Job]:
    """Every Job row of `cluster`'s runs of `kind` (the registry, or the daemon's live runs)
    made for one of `job_ids` (Slurm reuses ids)."""
    return session.scalars(select(Job).join(Run, Job.run_id == Run.id)
                           .where(Run.kind == kind, Run.cluster == cluster,
                                  Job.job_id.in_(list(job_ids))))


def registered_jobs(session: Session, cluster: str, wanted: Mapping[int, float], *,
                    tolerance_s: float = 600.0) -> dict[int, Job]:
    """Registered specs for Slurm jobs `{job_id: Slurm submit time}`.

    Slurm reuses job ids (after a controller reset or a wrap-around), so a registration counts
    only when it was made within `tolerance_s` of Slurm's submit time; the closest one wins.
    """
    if not wanted:
        return {}
    rows = _rows_for(session, cluster, REGISTRY_KIND, wanted)
    best: dict[int, Job] = {}
    for job in rows:
        gap = abs(job.submit_s - wanted[job.job_id])
        if gap <= tolerance_s and (job.job_id not in best
                                   or gap < abs(best[job.job_id].submit_s - wanted[job.job_id])):
            best[job.job_id] = job
    return best


class _Requeued(NamedTuple):
    submit_s: float          # Slurm's submit time: the latest requeue's
    user: str | None
    gpus: int


def first_submit_times(session: Session, cluster: str, jobs: Iterable[SlurmJob]
                       ) -> dict[int, float]:
    """The submit time each requeued job of `jobs` (restart count above 0) was first seen
    with, as the store knows it
    (Slurm's moves at each requeue, `live/first_submit.py`): of this cluster's live rows for its
    id, the latest at or before Slurm's time (what earlier daemons recorded it under), else its
    latest `shocksub` registration at or before then (requeued while no daemon ran). A row
    counts only when made for the same user and as many GPUs (not an older job whose id Slurm
    reused); jobs never requeued, and those the store knows nothing of, are left out."""
    wanted = {j.job_id: _Requeued(j.submit_time, j.user or None, j.gpus)
              for j in jobs if j.restart_count > 0}
    if not wanted:
        return {}
    out = _latest_before(_rows_for(session, cluster, "live", wanted), wanted)
    unseen = {j: w for j, w in wanted.items() if j not in out}
    return {**out, **_latest_before(_rows_for(session, cluster, REGISTRY_KIND, unseen), unseen)}


def _latest_before(rows: Iterable[Job], wanted: Mapping[int, _Requeued]) -> dict[int, float]:
    best: dict[int, float] = {}
    for job in rows:
        w = wanted[job.job_id]
        if (job.submit_s <= w.submit_s and job.gang_size == w.gpus
                and (job.owner is None or w.user is None or job.owner == w.user)
                and job.submit_s > best.get(job.job_id, float("-inf"))):
            best[job.job_id] = job.submit_s
    return best


def set_round_solve_s(session: Session, round_id: int, solve_s: float) -> None:
    """Fill in a live round's solve time (the round row is written before the solve is known to
    the cluster; the loop reports it after enactment)."""
    rnd = session.get(Round, round_id)
    if rnd is not None:
        rnd.solve_s = float(solve_s)


def stop_history(session: Session, cluster: str, wanted: Mapping[int, float], *,
                 since: datetime) -> dict[int, dict[str, list[float]]]:
    """What the live daemon did to jobs `{job_id: Slurm submit time}` since `since`, across
    every daemon run (incarnation) of `cluster`: `{job_id: {action: [Unix times]}}` for the
    `signal` and `requeuehold` intents that succeeded (return code 0), oldest first.

    The daemon's live runs record a job under Slurm's own submit time, so (job id, submit time)
    finds the same Slurm job in every run, and a restarted daemon recovers its churn state.
    """
    if not wanted:
        return {}
    rows = session.execute(
        select(Job.job_id, Job.submit_s, EnactmentIntent.action, EnactmentIntent.created_at)
        .join(Run, Job.run_id == Run.id)
        .join(EnactmentIntent, EnactmentIntent.job_pk == Job.id)
        .where(Run.kind == "live", Run.cluster == cluster, Job.job_id.in_(list(wanted)),
               EnactmentIntent.action.in_(("signal", "requeuehold")),
               EnactmentIntent.return_code == 0, EnactmentIntent.created_at >= since)
        .order_by(EnactmentIntent.created_at, EnactmentIntent.id))
    out: dict[int, dict[str, list[float]]] = {}
    for job_id, submit_s, action, created in rows:
        if submit_s != wanted.get(job_id):
            continue
        out.setdefault(job_id, {}).setdefault(action, []).append(stamp_seconds(created))
    return out
