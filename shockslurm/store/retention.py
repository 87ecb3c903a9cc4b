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

Rows go in batches of `BATCH_ROWS`, one transaction each, so that a daemon writing to the same
store (SQLite takes one writer at a time) waits at most for one batch.
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


def _old_samples(cutoff_s: float) -> Any:
    ts = ThroughputSample
    kept = select(func.max(ts.id)).group_by(ts.job_pk, ts.batch_size)
    return select(ts.id).where(ts.time_s < cutoff_s, ts.id.not_in(kept))


def _old_progress(cutoff_s: float) -> Any:
    ev = JobEvent
    kept = select(func.max(ev.id)).where(ev.kind == "progress").group_by(ev.job_pk)
    return select(ev.id).where(ev.kind == "progress", ev.time_s < cutoff_s, ev.id.not_in(kept))


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


def prune_reports(engine: Engine, cutoff_s: float, *, dry_run: bool = False) -> Pruned:
    """Delete the report rows older than `cutoff_s` (Unix seconds) that nothing reads (module
    docstring); with `dry_run`, count them only."""
    samples, progress = _old_samples(cutoff_s), _old_progress(cutoff_s)
    if dry_run:
        return Pruned(_count(engine, samples), _count(engine, progress))
    return Pruned(_delete_in_batches(engine, ThroughputSample, samples),
                  _delete_in_batches(engine, JobEvent, progress))
