"""`ReportedProgress`: the live daemon's `ProgressSource` on the training helper's reports.

Wired by `daemon.build_daemon` only (the Slurm layer knows the `ProgressSource` protocol, never
the store). Each round `refresh` gets every active job and

1. ingests the spool directory, when one is configured (`reports.ingest.SpoolIngest`: counts
   are logged, a failure is logged and never stops the round);
2. reads, in ONE query for all jobs (a UNION ALL), the reports of the jobs' registrations
   (`shocksub --db` registers a job; reports resolve to that row): every `epoch_done` event, the
   latest `progress` event (position written with each throughput report), the latest throughput
   sample and the latest batch-size change. Which registration a job has is looked up once per
   job (one query for all the jobs not known yet) and cached.

`progress` then builds a job's `Progress` from them:

- epochs done: the position of the latest progress event, at least the number of completed
  epochs (epoch_done events), carried on at the reported speed since that report for a running
  job (at most `EXTRAPOLATE_AT_MOST_S`, and within its epoch), kept one iteration short of the
  end like the run-time estimate;
- batch size: the newest of the latest throughput sample's and the latest change's, else the last
  completed epoch's, else the spec's;
- observed batch sizes: the batch size of each completed epoch from its epoch_done event (an epoch
  whose event is missing takes the previous epoch's, or the current batch size when it lies past
  the last completed epoch: its steps are done but the job stopped before closing it);
- iterations/s: the latest throughput sample's samples/s over the current batch size (samples/s
  assumed unchanged across a batch-size change).

A job with no reports, or whose reports cannot be read, falls back to `RunTimeProgress`. A
store that is unavailable (locked, unreachable, timed out: `store.database.is_unavailable`) is
not a reason to guess, though: the ingest and the reads raise `JournalUnavailable`, the round
stops before acting and the daemon logs one store outage.

It is also the cluster's `StopHistorySource` (churn bounds, `slurm.enact.ChurnLimits`): the same
round query reads each job's latest successful checkpoint report and the failed ones after it;
`stop_history` reads, when a stop is being decided (one query), the successful `requeuehold`
intents of every daemon incarnation from the store, so the per-day count and the
stops-without-checkpoint count survive a daemon restart; `flag` records a `flagged` job event
(once per job) on the job's registration.

Spool reports must be signed with the key registered for their job (`train.records`); unsigned
reports of jobs registered without a key are accepted only with `allow_unsigned_reports`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from datetime import datetime, timezone

from sqlalchemy import Engine, Float, Integer, String, Text, cast, func, literal, null, select
from sqlalchemy import union_all
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, aliased

from ..model import RunLength
from .ingest import SpoolIngest
from .owned import RecentOwners, slurm_owners
from ..live.enact import StopHistory
from ..live.journaling import JournalUnavailable
from ..live.progress_source import Progress, ProgressSource, RunTimeProgress, progress_ceiling
from ..live.specs import LiveSpec
from ..slurm.types import JobState, SlurmJob
from ..store import repository as repo
from ..store.database import describe, is_unavailable
from ..store.models import BatchSizeChange, Checkpoint, Job, JobEvent, ThroughputSample

log = logging.getLogger("shockslurm.daemon")

# A running job's position is carried past its latest report at its reported speed for at most
# this long (the training helper reports every 10 s by default, the live benchmark's stand-in
# every 2 s). Without it the finish window judged a job by a position up to a report interval
# old: live benchmark runs on two days stopped the same 8-GPU job with 28-29 s of its 57 s left,
# seen as 30 s or more, just past the 30 s window. The cap bounds what a job that stopped
# reporting (hung) gains: it looks at most this much further on, so the finish window shields
# it no longer than that.
EXTRAPOLATE_AT_MOST_S = 10.0


@dataclass
class JobReports:
    """What the store holds about one job's training, as read this round."""

    epoch_bs: dict[int, int | None] = field(default_factory=dict)   # completed epoch -> bs
    last_epoch_time: float | None = None
    position: float | None = None            # epochs, from the latest progress event
    position_time: float | None = None
    throughput: tuple[float, float, int] | None = None    # (time, samples/s, batch size)
    change: tuple[float, int] | None = None                # (time, new batch size)
    last_ok_checkpoint: float | None = None                # time of the latest ok=true one
    failed_checkpoints: int = 0                            # ok=false reports after it
    last_failed_checkpoint: float | None = None            # time of the latest of those

    @property
    def last_report_s(self) -> float | None:
        """When the job last reported (the report's own time), whatever the kind."""
        times = [self.last_epoch_time, self.position_time, self.last_ok_checkpoint,
                 self.last_failed_checkpoint]
        times += [latest[0] for latest in (self.throughput, self.change) if latest is not None]
        known = [t for t in times if t is not None]
        return max(known) if known else None

    @property
    def empty(self) -> bool:
        """No progress information (checkpoint reports alone say nothing about progress)."""
        return (not self.epoch_bs and self.position is None and self.throughput is None
                and self.change is None)

    @property
    def any(self) -> bool:
        """The job has sent at least one report (it runs the training helper)."""
        return not self.empty or self.last_ok_checkpoint is not None or \
            self.failed_checkpoints > 0

    def current_batch_size(self) -> int | None:
        latest = [x for x in (self.throughput and (self.throughput[0], self.throughput[2]),
                              self.change) if x]
        if latest:
            return max(latest, key=lambda tb: tb[0])[1]
        if self.epoch_bs:
            return self.epoch_bs[max(self.epoch_bs)]
        return None


def _latest_ids(entity: Any, pks: Sequence[int], **equal: Any) -> Any:
    """The id of each job's latest row of `entity` whose columns equal `equal`: a max per job
    correlated to the job, which an index on (job_pk, ..., id) answers with one seek (revision
    0005), where a GROUP BY read every row the job ever reported, a longer read each round."""
    inner = aliased(entity)
    latest = (select(func.max(inner.id))
              .where(inner.job_pk == Job.id,
                     *(getattr(inner, column) == value for column, value in equal.items()))
              .correlate(Job).scalar_subquery())
    return select(latest).where(Job.id.in_(pks))


def read_reports(session: Session, pks: Sequence[int]) -> dict[int, JobReports]:
    """The reports of the jobs `pks` (store keys), in one query."""
    if not pks:
        return {}
    out: dict[int, JobReports] = {}
    rows = session.execute(_reports_query(list(pks)))
    for kind, job_pk, _id, time_s, bs, x, detail in sorted(rows, key=lambda r: (r[1], r[2])):
        _fold(out.setdefault(job_pk, JobReports()), kind, float(time_s), bs, x, detail)
    return out


def _reports_query(pks: list[int]) -> Any:
    """One UNION of the rows `_fold` reads: (kind, job_pk, id, time_s, batch size, number,
    detail) per epoch event, latest progress, throughput sample, batch-size change and ok
    checkpoint, and the failed checkpoints since the last ok one (counted)."""
    ev = JobEvent
    columns = (ev.kind.label("kind"), ev.job_pk.label("job_pk"), ev.id.label("id"),
               ev.time_s.label("time_s"), cast(null(), Integer).label("bs"),
               cast(null(), Float).label("x"), ev.detail.label("detail"))
    # two selects, not one with an OR: each is an index range or seek (revision 0005)
    epochs = select(*columns).where(ev.job_pk.in_(pks), ev.kind == "epoch_done")
    progress = select(*columns).where(ev.id.in_(_latest_ids(ev, pks, kind="progress")))
    ts = ThroughputSample
    samples = select(literal("throughput", String).label("kind"), ts.job_pk, ts.id, ts.time_s,
                     ts.batch_size, ts.samples_per_s, cast(null(), Text)).where(
        ts.id.in_(_latest_ids(ts, pks)))
    bc = BatchSizeChange
    changes = select(literal("batch_size_change", String).label("kind"), bc.job_pk, bc.id,
                     bc.time_s, bc.new_batch_size, cast(bc.old_batch_size, Float),
                     cast(null(), Text)).where(bc.id.in_(_latest_ids(bc, pks)))
    ck = Checkpoint
    ok_ckpt = select(literal("checkpoint_ok", String).label("kind"), ck.job_pk, ck.id, ck.time_s,
                     cast(null(), Integer), cast(null(), Float), cast(null(), Text)).where(
        ck.id.in_(_latest_ids(ck, pks, ok=True)))
    ck2 = aliased(Checkpoint)
    last_ok_id = (select(func.coalesce(func.max(ck2.id), 0))
                  .where(ck2.job_pk == ck.job_pk, ck2.ok.is_(True)).scalar_subquery())
    failed = select(literal("checkpoint_failed", String).label("kind"), ck.job_pk,
                    func.max(ck.id), func.max(ck.time_s), cast(func.count(), Integer),
                    cast(null(), Float), cast(null(), Text)).where(
        ck.job_pk.in_(pks), ck.ok.is_(False), ck.id > last_ok_id).group_by(ck.job_pk)
    return union_all(epochs, progress, samples, changes, ok_ckpt, failed)


def _fold(r: JobReports, kind: str, time_s: float, bs: int | None, x: float | None,
          detail: str | None) -> None:
    """One row of `_reports_query` into the job's reports (rows in id order)."""
    if kind == "throughput":
        if x is not None and math.isfinite(x) and x > 0 and bs:
            r.throughput = (time_s, float(x), int(bs))
    elif kind == "batch_size_change":
        r.change = (time_s, int(bs or 0))
    elif kind == "checkpoint_ok":
        r.last_ok_checkpoint = time_s
    elif kind == "checkpoint_failed":
        r.failed_checkpoints = int(bs or 0)
        r.last_failed_checkpoint = time_s
    else:
        _fold_event(r, kind, time_s, detail)


def _fold_event(r: JobReports, kind: str, time_s: float, detail: str | None) -> None:
    """An `epoch_done` or `progress` job event; a detail that is not a JSON object, or whose
    values are out of range, is ignored."""
    try:
        info = json.loads(detail or "{}")
    except ValueError:
        return
    if not isinstance(info, dict):
        return
    if kind == "epoch_done":
        epoch = info.get("epoch")
        if isinstance(epoch, int) and not isinstance(epoch, bool) and epoch >= 0:
            size = info.get("batch_size")
            r.epoch_bs[epoch] = (size if isinstance(size, int) and size > 0
                                 and not isinstance(size, bool) else None)
            r.last_epoch_time = max(r.last_epoch_time or time_s, time_s)
    elif kind == "progress":
        pos = info.get("epoch_progress")
        if isinstance(pos, (int, float)) and not isinstance(pos, bool) and \
                math.isfinite(pos) and pos >= 0:
            r.position, r.position_time = float(pos), time_s


def observed_batch_sizes(epoch_bs: Mapping[int, int | None], done: int, completed: int,
                         current: int, initial: int) -> RunLength:
    """The batch size of each of the first `done` epochs, run-length encoded (O(reported
    epochs), whatever `done` is): an epoch's reported size; an epoch whose event is missing (or
    carries no size) ran, before the last completed one (`completed`), at the previous epoch's
    size (`initial` before the first), and from it on (its steps are done but it was not closed,
    e.g. the job stopped on its last step) at the size the job reports now (`current`)."""
    runs: list[tuple[int, int]] = []
    previous, e = initial, 0
    for epoch in sorted(k for k in epoch_bs if k < done):
        runs.append((previous, epoch - e))              # the gap before it, if any
        previous = epoch_bs[epoch] or previous
        runs.append((previous, 1))
        e = epoch + 1
    upto = max(e, min(completed, done))
    runs += [(previous, upto - e), (current, done - upto)]
    return RunLength(runs)


def _unavailable(what: str, exc: BaseException) -> JournalUnavailable:
    """A store outage during a round: the round stops before acting (the daemon logs it)."""
    return JournalUnavailable(f"the store cannot {what}: {type(exc).__name__}: "
                              f"{describe(exc)}")


class ReportedProgress:
    """`ProgressSource` on the store's training reports, with a run-time fallback."""

    def __init__(self, engine: Engine, *, cluster: str, spool_dir: str | os.PathLike[str] |
                 None = None, rejected_dir: str | os.PathLike[str] = "",
                 fallback: ProgressSource | None = None,
                 allow_unsigned_reports: bool = False) -> None:
        self.engine = engine
        self.allow_unsigned_reports = allow_unsigned_reports
        self.cluster = cluster
        self.spool_dir = spool_dir or None
        self.spool = (SpoolIngest(str(spool_dir), str(rejected_dir),
                                  allow_unsigned=allow_unsigned_reports, cluster=cluster)
                      if spool_dir else None)
        self.fallback = fallback or RunTimeProgress()
        self._pk: dict[tuple[int, float], int] = {}
        self._owners = RecentOwners()
        self.reports: dict[tuple[int, float], JobReports] = {}
        self.queries = 0            # report reads (tests check: one per round)
        self.now: float | None = None   # the round's time (`refresh`)
        self.ingested = 0           # report files ingested from the spool, all rounds

    # ------------------------------------------------------------------ per round
    def ingest(self) -> int:
        """Ingest the spool (if any); never raises."""
        if self.spool is None:
            return 0
        try:
            n = self.spool.run(self.engine)
        except SQLAlchemyError as exc:
            if is_unavailable(exc):
                raise _unavailable("ingest the spool", exc) from exc
            # the error's class only: its message may quote a report's values
            log.warning("spool %s: ingest failed (%s); retried next round", self.spool_dir,
                        type(exc).__name__)
            return 0
        except Exception as exc:   # the store's errors (never a file's content: see reports/)
            log.warning("spool %s: ingest failed (%s: %s); retried next round", self.spool_dir,
                        type(exc).__name__, exc)
            return 0
        if n:
            log.info("spool %s: ingested %d report(s)", self.spool_dir, n)
        self.ingested += n
        return n

    def refresh(self, jobs: Sequence[SlurmJob], now: float | None = None) -> None:
        self.now = now
        if self.spool is not None:   # plain sbatch jobs' reports (`owned`)
            self.spool.owners = self._owners.update(slurm_owners(jobs), time.monotonic())
        self.ingest()
        keys = {(j.job_id, j.submit_time) for j in jobs}
        try:
            with Session(self.engine) as s:
                unknown = {jid: t for jid, t in keys if (jid, t) not in self._pk}
                if unknown:
                    for jid, row in repo.registered_jobs(s, self.cluster, unknown).items():
                        self._pk[(jid, unknown[jid])] = row.id
                wanted = {k: self._pk[k] for k in keys if k in self._pk}
                by_pk = read_reports(s, sorted(set(wanted.values())))
                self.queries += 1
        except SQLAlchemyError as exc:
            if is_unavailable(exc):
                raise _unavailable("read training reports", exc) from exc
            log.warning("could not read training reports (%s: %s); estimating progress from "
                        "run time this round", type(exc).__name__, exc)
            self.reports = {}
            return
        except Exception as exc:
            log.warning("could not read training reports (%s: %s); estimating progress from "
                        "run time this round", type(exc).__name__, exc)
            self.reports = {}
            return
        self.reports = {k: by_pk[pk] for k, pk in wanted.items() if pk in by_pk}
        self._pk = {k: v for k, v in self._pk.items() if k in keys}   # forget finished jobs

    def progress(self, job: SlurmJob, spec: LiveSpec, run_time_s: float,
                 epoch_s: float) -> Progress:
        base = self.fallback.progress(job, spec, run_time_s, epoch_s)
        r = self.reports.get((job.job_id, job.submit_time))
        if r is None or r.empty:
            return base
        bs = r.current_batch_size() or base.batch_size
        completed = (max(r.epoch_bs) + 1) if r.epoch_bs else 0
        ips = None if r.throughput is None else r.throughput[1] / bs
        if r.position is not None or r.epoch_bs:
            done, at = float(completed), r.last_epoch_time
            if r.position is not None and (r.last_epoch_time is None or r.position_time is None
                                           or r.position_time >= r.last_epoch_time):
                done, at = max(done, r.position), r.position_time
            done = self._carried(job, done, at, ips, math.ceil(spec.samples_per_epoch / bs))
            done = max(0.0, min(done, progress_ceiling(spec, bs)))
        else:      # a throughput sample only: where the job is stays an estimate
            done = base.epochs_done
        observed = observed_batch_sizes(r.epoch_bs, int(done), completed, bs, spec.batch_size)
        return Progress(epochs_done=done, batch_size=bs, observed_batch_sizes=observed,
                        iterations_per_s=ips, source="reports")

    def _carried(self, job: SlurmJob, done: float, reported_at: float | None,
                 ips: float | None, iters_per_epoch: int) -> float:
        """A running job's position `done` (epochs, reported at `reported_at` in this run)
        carried on at its reported speed `ips` for at most `EXTRAPOLATE_AT_MOST_S`, and not
        past the end of its epoch (the next may change its batch size); unchanged when any of
        it is unknown."""
        if (self.now is None or reported_at is None or ips is None
                or job.state is not JobState.RUNNING
                or (job.start_time is not None and reported_at < job.start_time)):
            return done
        since = ips * min(EXTRAPOLATE_AT_MOST_S, max(0.0, self.now - reported_at))
        return min(done + since / iters_per_epoch,
                   max(done, math.floor(done) + 1 - 1 / iters_per_epoch))

    # ------------------------------------------------------------------ StopHistorySource
    def stop_history(self, jobs: Sequence[SlurmJob]) -> dict[int, StopHistory]:
        """Every recorded preemption of `jobs` (any daemon incarnation) and their checkpoint
        health from this round's reports; raises when the store cannot be read (the cluster
        then falls back to its memory)."""
        try:
            with Session(self.engine) as s:
                found = repo.stop_history(s, self.cluster,
                                          {j.job_id: j.submit_time for j in jobs},
                                          since=datetime.fromtimestamp(0, timezone.utc))
        except SQLAlchemyError as exc:
            if is_unavailable(exc):
                raise _unavailable("read the stop history", exc) from exc
            raise
        out = {}
        for j in jobs:
            r = self.reports.get((j.job_id, j.submit_time))
            out[j.job_id] = StopHistory(
                preemptions=tuple(found.get(j.job_id, {}).get("requeuehold", ())),
                reports=r is not None and r.any,
                last_ok_checkpoint=r.last_ok_checkpoint if r is not None else None,
                failed_checkpoints=r.failed_checkpoints if r is not None else 0)
        return out

    def flag(self, job: SlurmJob, reason: str, now: float) -> None:
        """Record a `flagged` job event on the job's registration (once per job)."""
        pk = self._pk.get((job.job_id, job.submit_time))
        if pk is None:
            return
        with Session(self.engine) as s, s.begin():
            repo.add_job_event_once(s, pk, time_s=now, kind="flagged",
                                    detail=json.dumps({"reason": reason}))
