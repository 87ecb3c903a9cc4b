"""The status of managed jobs: one row per job, from one Slurm read and one store read.

Columns and where they come from:
- job id, name, user, state (Slurm's base state; `reason` says why a pending job waits, e.g.
  `JobHeldUser` for a job the meta-scheduler holds), GPUs, times preempted (Slurm's restart count:
  every requeue of a managed job is a preemption by the daemon) come from `squeue --json`.
- progress `done/epochs`: epochs done from the job's latest `epoch_done` report in the store
  (the training helper's reports; `epoch` is 0-based, so done = epoch + 1), else 0 when the
  job has reported throughput only, else "-" (no report at all: we do not guess).
- forecast remaining: the Shockwave forecaster's Dirichlet model
  (`forecast.dirichlet_remaining_time`) over the epochs after the one in progress, plus what is
  left of the epoch in progress. Epoch durations per batch size are measured (samples per epoch /
  the latest samples/s reported at that batch size); batch sizes never measured use the declared
  exclusive epoch time (`slurm.specs.epoch_seconds`). "-" without any report.
- reported: how long ago the job last sent a training report of any kind (the report's own
  time, from the one read model of reports, `reports.reported_progress.read_reports`); "-" when
  it never did (no helper, or its reports do not reach the daemon: the job's log says why).
- rho estimate: `(now - submit + remaining) / exclusive runtime`, with `submit` the job's first
  submission (Slurm's submit time moves at each requeue; for a requeued job the store's first
  submit time, `repository.first_submit_times`, as the daemon keeps it) and exclusive runtime =
  epochs x declared exclusive epoch time on the job's GPUs. It is the slowdown the job is heading
  for against running alone from submission, i.e. the finish-time fairness rho with contention 1
  (the simulator's metric additionally divides by max(1, N/G)). rho <= 1 means on track to finish
  no later than alone; "-" when the remaining time is unknown.

The job's spec is found like the daemon finds it: the `shock:spec=` comment, else the spec
`shocksub --db` registered in the store, else the documented defaults.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Mapping, Sequence

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from ..errors import printable
from ..forecast import dirichlet_remaining_time
from ..live import specs
from ..live.specs import LiveSpec, epoch_seconds
from ..reports.reported_progress import read_reports
from ..slurm.types import SlurmJob
from ..store.models import EnactmentIntent, Job, JobEvent, Round, Run, ThroughputSample
from ..store.repository import REGISTRY_KIND, first_submit_times

TOLERANCE_S = 600.0     # a store row belongs to a Slurm job when submitted within this of it
HISTORY = 10            # events / intents shown by `shocksub --status`
DASH = "-"


@dataclass
class StoreJob:
    """What the store knows of one Slurm job (every Job row of the cluster with its id and a
    submit time within `TOLERANCE_S`: its registration and its rows in live runs)."""

    spec: dict[str, Any] | None = None                    # the registered spec, if any
    epochs_done: int | None = None                        # from the latest epoch_done report
    last_epoch_s: float | None = None
    observed: list[int] = field(default_factory=list)     # batch size of each completed epoch
    rate_by_bs: dict[int, float] = field(default_factory=dict)  # latest samples/s per batch size
    batch_size: int | None = None                          # of the latest throughput sample
    reported: bool = False
    last_report_s: float | None = None                    # when it last reported, any kind
    events: list[tuple[float, str, str]] = field(default_factory=list)   # (time_s, kind, detail)
    intents: list[tuple[str, str, str, str]] = field(default_factory=list)  # (created, action, rc, argv)
    first_submit_s: float | None = None                   # a requeued job's first submission


@dataclass(frozen=True)
class StatusRow:
    job_id: int
    name: str
    user: str
    state: str
    reason: str
    gpus: int
    epochs_done: int | None
    epochs: int
    remaining_s: float | None
    rho: float | None
    preempted: int
    spec_source: str
    last_report_s: float | None = None        # when the job last reported (the report's time)
    last_report_age_s: float | None = None    # how long before `now` that was

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def cells(self) -> list[str]:
        progress = DASH if self.epochs_done is None else f"{self.epochs_done}/{self.epochs}"
        reported = DASH if self.last_report_age_s is None else \
            f"{format_duration(self.last_report_age_s)} ago"
        return [str(self.job_id), self.name, self.user, self.state, self.reason, str(self.gpus),
                progress, format_duration(self.remaining_s),
                DASH if self.rho is None else f"{self.rho:.2f}", str(self.preempted), reported]


HEADERS = ["JOBID", "NAME", "USER", "STATE", "REASON", "GPUS", "PROGRESS", "REMAINING", "RHO",
           "PREEMPTED", "REPORTED"]


def format_duration(seconds: float | None) -> str:
    """42s, 5m10s, 3h02m; "-" for unknown."""
    if seconds is None or not math.isfinite(seconds):
        return DASH
    s = int(round(max(0.0, seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def format_table(rows: Sequence[StatusRow]) -> str:
    """Left-aligned text columns, numbers right-aligned; what a job named itself (a newline, a
    terminal escape) shown escaped (`errors.printable`): a job named with a newline and a row
    of text showed as two jobs."""
    numeric = {0, 5, 6, 7, 8, 9, 10}
    table = [HEADERS] + [[printable(c) for c in r.cells()] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADERS))]
    out = []
    for line in table:
        out.append("  ".join(c.rjust(w) if i in numeric else c.ljust(w)
                             for i, (c, w) in enumerate(zip(line, widths))).rstrip())
    return "\n".join(out)


# ------------------------------------------------------------------------------- store read
def read_store(engine: Engine, cluster: str, jobs: Sequence[SlurmJob], *,
               history: bool = False) -> dict[int, StoreJob]:
    """One read transaction: registrations, reports (and with `history`, events and intents)
    of `jobs`, by Slurm job id."""
    if not jobs:
        return {}
    out: dict[int, StoreJob] = {}
    with Session(engine) as s:
        submit = {j.job_id: j.submit_time for j in jobs}
        first = first_submit_times(s, cluster, jobs)
        for job_id, first_s in first.items():
            submit[job_id] = first_s
            out.setdefault(job_id, StoreJob()).first_submit_s = first_s
        owner = _registrations(s, cluster, submit, out)
        if not owner:
            return out
        _read_samples(s, owner, out)
        _read_events(s, owner, out, history)
        if history:
            _read_intents(s, owner, out)
            for info in out.values():
                info.events = info.events[-HISTORY:]
                info.intents = info.intents[-HISTORY:]
    return out


def _registrations(s: Session, cluster: str, submit: Mapping[int, float],
                   out: dict[int, StoreJob]) -> dict[int, int]:
    """The store's jobs of these Slurm jobs (an older job with a reused id is not one), each
    job's spec and last report from its registration into `out`; returns job pk -> Slurm id."""
    # a ladder that is no JSON (a hand edit) reads back as its text (`models.StoredJSON`): a
    # bad spec of that job (flagged, defaults used), not a JSONDecodeError of the whole table
    rows = s.execute(select(Job.id, Job.job_id, Job.submit_s, Job.model, Job.epochs,
                            Job.samples_per_epoch, Job.batch_sizes, Run.kind)
                     .join(Run, Job.run_id == Run.id)
                     .where(Run.cluster == cluster, Job.job_id.in_(list(submit)))).all()
    owner: dict[int, int] = {}            # job pk -> Slurm job id
    registration: dict[int, Any] = {}
    for job in rows:
        kind = job.kind
        if abs(job.submit_s - submit[job.job_id]) > TOLERANCE_S:
            continue                        # an older job with a reused id
        owner[job.id] = job.job_id
        out.setdefault(job.job_id, StoreJob())
        if kind == REGISTRY_KIND:
            best = registration.get(job.job_id)
            if best is None or (abs(job.submit_s - submit[job.job_id])
                                < abs(best.submit_s - submit[job.job_id])):
                registration[job.job_id] = job
    for job_id, job in registration.items():
        out[job_id].spec = {"model": job.model, "epochs": job.epochs,
                            "samples_per_epoch": job.samples_per_epoch,
                            "batch_sizes": job.batch_sizes}   # job_spec checks
    # reports resolve to the registration (`train.records.resolve_job_pk`)
    reports = read_reports(s, [job.id for job in registration.values()])
    for job_id, job in registration.items():
        if job.id in reports:
            out[job_id].last_report_s = reports[job.id].last_report_s
    return owner


def _read_samples(s: Session, owner: Mapping[int, int], out: dict[int, StoreJob]) -> None:
    """Throughput samples: the rate per batch size and the latest batch size."""
    for sample in s.scalars(select(ThroughputSample)
                            .where(ThroughputSample.job_pk.in_(list(owner)))
                            .order_by(ThroughputSample.time_s, ThroughputSample.id)):
        info = out[owner[sample.job_pk]]
        info.reported = True
        info.rate_by_bs[sample.batch_size] = sample.samples_per_s
        info.batch_size = sample.batch_size


def _read_events(s: Session, owner: Mapping[int, int], out: dict[int, StoreJob],
                 history: bool) -> None:
    """Job events: epochs done and the batch sizes they ran (and every event, for history)."""
    for ev in s.scalars(select(JobEvent).where(JobEvent.job_pk.in_(list(owner)))
                        .order_by(JobEvent.time_s, JobEvent.id)):
        info = out[owner[ev.job_pk]]
        if ev.kind == "epoch_done":
            detail = _json(ev.detail)
            epoch = detail.get("epoch")
            if isinstance(epoch, int):
                info.reported = True
                info.epochs_done = max(info.epochs_done or 0, epoch + 1)
                info.last_epoch_s = ev.time_s
                bs = detail.get("batch_size")
                if isinstance(bs, int):
                    info.observed.append(bs)
        if history:
            info.events.append((ev.time_s, ev.kind, ev.detail or ""))


def _read_intents(s: Session, owner: Mapping[int, int], out: dict[int, StoreJob]) -> None:
    """The daemon's enactment intents on these jobs, with their round."""
    q = (select(EnactmentIntent, Round.round_index)
         .join(Round, EnactmentIntent.round_id == Round.id)
         .where(EnactmentIntent.job_pk.in_(list(owner)))
         .order_by(EnactmentIntent.created_at, EnactmentIntent.id))
    for intent, round_index in s.execute(q).all():
        info = out[owner[intent.job_pk]]
        rc = "pending" if intent.return_code is None else f"rc={intent.return_code}"
        info.intents.append((_stamp(intent.created_at), f"round {round_index} "
                             f"{intent.action}", rc, _shown_argv(intent.argv)))


def _shown_argv(argv: Any) -> str:
    """An intent's stored argv as one line: a list's items joined, anything else (a
    hand-edited row) as its text."""
    return " ".join(map(str, argv)) if isinstance(argv, list) else str(argv)


def _json(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%d %H:%M:%S")


# ------------------------------------------------------------------------------ the rows
def job_spec(job: SlurmJob, info: StoreJob | None) -> LiveSpec:
    """The spec the daemon would use: comment, else the store's registration, else defaults;
    the defaults for a bad spec (the daemon leaves that job held and flags it)."""
    try:
        return specs.job_spec(job.comment, info.spec if info is not None else None)
    except specs.BadSpec:
        return specs.DEFAULT_SPEC


def forecast_remaining(spec: LiveSpec, gpus: int, info: StoreJob | None, *, running: bool,
                       now: float) -> float | None:
    """Seconds of exclusive running left (see the module docstring); None without reports."""
    if info is None or not info.reported:
        return None
    total = spec.epochs
    done = min(info.epochs_done or 0, total)
    if done >= total:
        return 0.0
    declared = epoch_seconds(spec, gpus)
    current = info.batch_size or (info.observed[-1] if info.observed else spec.batch_size)
    fallback = (spec.samples_per_epoch / info.rate_by_bs[current]
                if info.rate_by_bs.get(current, 0) > 0 else declared)
    duration_at = {spec.batch_size: declared}
    duration_at.update({bs: spec.samples_per_epoch / rate
                        for bs, rate in info.rate_by_bs.items() if rate > 0})
    observed = list(info.observed[:done])
    observed += [current] * (done - len(observed))
    for bs in observed + [current]:
        duration_at.setdefault(bs, fallback)
    after = dirichlet_remaining_time(total, done, observed + [current], duration_at)
    in_progress = duration_at[current]
    if running and info.last_epoch_s is not None:
        in_progress = max(0.0, in_progress - max(0.0, now - info.last_epoch_s))
    return after + in_progress


def status_row(job: SlurmJob, info: StoreJob | None, now: float) -> StatusRow:
    spec = job_spec(job, info)
    gpus = job.gpus
    remaining = forecast_remaining(spec, gpus, info, running=job.state.holds_gpus, now=now)
    exclusive = spec.epochs * epoch_seconds(spec, gpus)
    rho = None
    if remaining is not None and exclusive > 0:
        submit = (info.first_submit_s if info is not None and info.first_submit_s is not None
                  else job.submit_time)
        rho = (max(0.0, now - submit) + remaining) / exclusive
    done = info.epochs_done if info is not None and info.reported else None
    if done is None and info is not None and info.reported:
        done = 0
    if done is not None:
        done = min(done, spec.epochs)
    last = info.last_report_s if info is not None else None
    return StatusRow(job_id=job.job_id, name=job.name, user=job.user, state=job.state.value,
                     reason=job.reason or "", gpus=gpus, epochs_done=done, epochs=spec.epochs,
                     remaining_s=remaining, rho=rho, preempted=job.restart_count,
                     spec_source=spec.source, last_report_s=last,
                     last_report_age_s=None if last is None else max(0.0, now - last))


def managed(jobs: Sequence[SlurmJob], partitions: Sequence[str] | None = None) -> list[SlurmJob]:
    """Managed jobs (tagged `shock:managed`), optionally only in `partitions`, by job id."""
    return sorted((j for j in jobs if j.managed
                   and (not partitions or j.partition in partitions)), key=lambda j: j.job_id)


def status_rows(jobs: Sequence[SlurmJob], store: dict[int, StoreJob], now: float
                ) -> list[StatusRow]:
    return [status_row(j, store.get(j.job_id), now) for j in jobs]
