"""Thinning the training reports a store gathers (`shockslurm db prune`).

A job that reports through the training helper writes a throughput sample and a `progress` event
every report interval (10 s by default): 100 running jobs make some 1.7 million rows a day, and
nothing reads most of them again. The daemon's round reads each job's latest of each
(`reports.reported_progress`), `shockslurm status` the latest sample per batch size. So a prune
deletes the throughput samples and `progress` events older than a cutoff, except each job's
latest `progress` event and its latest sample per batch size: what the daemon plans with and
what `status` shows are the same before and after. Everything else stays: jobs, runs, rounds,
plans, intents, every `epoch_done` event (the epochs' batch sizes, the forecast's history),
batch-size changes and checkpoints.

Job by job: each job's rows to keep (a handful of ids) are found once, then its old rows go in
batches of `BATCH_ROWS`, one transaction each, so that a daemon writing to the same store
(SQLite takes one writer at a time) waits at most for one batch; every query is an index range
of one job (revision 0005), never the whole table once per batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, delete, func, select
from sqlalchemy.orm import Session

from .models import JobEvent, ThroughputSample

BATCH_ROWS = 5_000
DAY_S = 86_400.0


@dataclass(frozen=True)
class Pruned:
    """How many rows a prune deleted (or, dry, would delete)."""

    throughput_samples: int
    progress_events: int


@dataclass(frozen=True)
class _Reports:
    """One kind of report row: its table, the condition that picks it out, and the columns per
    which each job's latest row is kept."""

    table: Any
    where: tuple[Any, ...]
    latest_per: tuple[Any, ...]


SAMPLES = _Reports(ThroughputSample, (), (ThroughputSample.batch_size,))
PROGRESS = _Reports(JobEvent, (JobEvent.kind == "progress",), ())


def _jobs_with_old(engine: Engine, reports: _Reports, cutoff_s: float) -> list[int]:
    t = reports.table
    with Session(engine) as s:
        return list(s.scalars(select(t.job_pk).where(t.time_s < cutoff_s, *reports.where)
                              .distinct().order_by(t.job_pk)))


def _old_of_job(engine: Engine, reports: _Reports, job_pk: int, cutoff_s: float) -> Any:
    """The ids of one job's rows older than `cutoff_s`, but its latest (per `latest_per`)."""
    t = reports.table
    with Session(engine) as s:
        kept = list(s.scalars(select(func.max(t.id)).where(t.job_pk == job_pk, *reports.where)
                              .group_by(*reports.latest_per)))
    return select(t.id).where(t.job_pk == job_pk, t.time_s < cutoff_s, t.id.not_in(kept),
                              *reports.where)


def _count(engine: Engine, ids: Any) -> int:
    with Session(engine) as s:
        return int(s.scalar(select(func.count()).select_from(ids.subquery())) or 0)


def _delete_in_batches(engine: Engine, table: Any, ids: Any) -> int:
    deleted = 0
    while True:
        with Session(engine) as s, s.begin():
            batch = list(s.scalars(ids.limit(BATCH_ROWS)))
            if not batch:
                return deleted
            s.execute(delete(table).where(table.id.in_(batch)))
        deleted += len(batch)


def _prune(engine: Engine, reports: _Reports, cutoff_s: float, dry_run: bool) -> int:
    total = 0
    for job_pk in _jobs_with_old(engine, reports, cutoff_s):
        ids = _old_of_job(engine, reports, job_pk, cutoff_s)
        total += _count(engine, ids) if dry_run else _delete_in_batches(engine, reports.table,
                                                                        ids)
    return total


def prune_reports(engine: Engine, cutoff_s: float, *, dry_run: bool = False) -> Pruned:
    """Delete the report rows older than `cutoff_s` (Unix seconds) that nothing reads (module
    docstring); with `dry_run`, count them only."""
    return Pruned(_prune(engine, SAMPLES, cutoff_s, dry_run),
                  _prune(engine, PROGRESS, cutoff_s, dry_run))
