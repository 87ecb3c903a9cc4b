"""SQLAlchemy 2.x typed declarative models of the store.

Why these shapes:
- A Slurm job id is reused after a wrap-around or a controller reset, so a job is identified by
  (run/cluster, job id, submit time) under a unique constraint, and every other table points at a
  surrogate integer key instead of repeating the triple.
- Times of simulated runs are virtual seconds and those of live runs Unix seconds, so event times
  are plain floats (`*_s`); wall-clock bookkeeping (when a run started, when an intent was
  created/finished) uses timezone-aware timestamps.
- Variable-length data (batch-size ladder, run configuration, an sbatch/scontrol argv) is JSON:
  it is read back whole, never queried inside. A value that is no JSON (a hand-edited SQLite
  file; PostgreSQL refuses one) reads back as its text, for the reader to refuse: one bad row
  is that row's problem, not a store that cannot be read.
The generated DDL is frozen in `sql/schema-*.sql` (checked by tests) and built by migrations.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (JSON, BigInteger, Boolean, DateTime, Float, ForeignKey, Index, Integer,
                        MetaData, String, Text, UniqueConstraint)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

# Deterministic constraint names: migrations and the frozen DDL must name them the same everywhere.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base whose metadata carries the naming convention."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class StoredJSON(TypeDecorator[Any]):
    """JSON whose stored text, when it is no JSON, reads back as that text."""

    impl = JSON
    cache_ok = True

    def result_processor(self, dialect: Dialect, coltype: object) -> Any:
        parse = super().result_processor(dialect, coltype)
        if parse is None:                   # the driver parses it (PostgreSQL's)
            return None

        def lenient(value: Any) -> Any:
            try:
                return parse(value)
            except ValueError:              # json.JSONDecodeError
                return value
        return lenient


def stamp_seconds(when: datetime) -> float:
    """Unix seconds of a stored `DateTime(timezone=True)` stamp (SQLite hands them back naive:
    they are UTC)."""
    return (when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)).timestamp()


class Run(Base):
    """One simulated or live run of the round loop (a cluster, for a daemon)."""

    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # "sim" or "live"
    cluster: Mapped[str] = mapped_column(String(128))
    policy: Mapped[str] = mapped_column(String(64))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    config: Mapped[dict[str, Any]] = mapped_column(StoredJSON)

    jobs: Mapped[list[Job]] = relationship(back_populates="run")
    rounds: Mapped[list[Round]] = relationship(back_populates="run")


class Job(Base):
    """A job and its declared spec, keyed by (run, job id, submit time)."""

    __tablename__ = "jobs"
    __table_args__ = (UniqueConstraint("run_id", "job_id", "submit_s"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    # Slurm or simulator job id; indexed by revision 0005 (the daemon looks its jobs up by it)
    job_id: Mapped[int] = mapped_column(BigInteger, index=True)
    submit_s: Mapped[float] = mapped_column(Float)
    owner: Mapped[str | None] = mapped_column(String(128))
    model: Mapped[str] = mapped_column(String(128))
    epochs: Mapped[int] = mapped_column(Integer)
    samples_per_epoch: Mapped[int] = mapped_column(BigInteger)
    batch_sizes: Mapped[list[int]] = mapped_column(StoredJSON)  # the ladder, ascending
    gang_size: Mapped[int] = mapped_column(Integer)
    # Added by revision 0003: the HMAC-SHA256 key (hex) the job's training reports are signed
    # with, derived from the secret shocksub handed the job (never the secret itself). NULL for
    # jobs registered without one.
    report_key: Mapped[str | None] = mapped_column(String(64))

    run: Mapped[Run] = relationship(back_populates="jobs")


class JobEvent(Base):
    """A lifecycle event of a job (submitted, started, preempted, completed, failed...)."""

    __tablename__ = "job_events"
    # Added by revision 0005: each job's latest event of a kind is one index seek, however long
    # the job has been reporting (`reports.reported_progress`).
    __table_args__ = (Index("ix_job_events_job_pk_kind_id", "job_pk", "kind", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_pk: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    time_s: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(32))
    detail: Mapped[str | None] = mapped_column(Text)


class Round(Base):
    """One round of a run: when, which policy, how long the solve took and how it ended."""

    __tablename__ = "rounds"
    __table_args__ = (UniqueConstraint("run_id", "round_index"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    round_index: Mapped[int] = mapped_column(Integer)
    time_s: Mapped[float] = mapped_column(Float)
    policy: Mapped[str] = mapped_column(String(64))
    solve_s: Mapped[float] = mapped_column(Float)
    status: Mapped[str | None] = mapped_column(String(32))
    objective: Mapped[float | None] = mapped_column(Float)
    # idle GPU-seconds since the previous round, by cause (`live.idle`); NULL: not measured
    idle_switch_gpu_s: Mapped[float | None] = mapped_column(Float)
    idle_unplaceable_gpu_s: Mapped[float | None] = mapped_column(Float)
    idle_waiting_gpu_s: Mapped[float | None] = mapped_column(Float)

    run: Mapped[Run] = relationship(back_populates="rounds")


class PlanEntry(Base):
    """A job the round's plan runs, and on how many GPUs."""

    __tablename__ = "plan_entries"
    __table_args__ = (UniqueConstraint("round_id", "job_pk"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("rounds.id", ondelete="CASCADE"))
    job_pk: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    gpus: Mapped[int] = mapped_column(Integer)


class EnactmentIntent(Base):
    """A Slurm action the daemon meant to take, written before it runs so a crash leaves a trace.

    `argv` is the exact command line; `return_code`, `stderr` and `finished_at` stay empty until
    the command returns.
    """

    __tablename__ = "enactment_intents"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("rounds.id", ondelete="CASCADE"), index=True)
    # indexed by revision 0005: the stops under way are read by job every round
    job_pk: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    action: Mapped[str] = mapped_column(String(32))
    argv: Mapped[list[str]] = mapped_column(StoredJSON)
    return_code: Mapped[int | None] = mapped_column(Integer)
    stderr: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class ThroughputSample(Base):
    """Observed training speed of a job at some batch size and gang size."""

    __tablename__ = "throughput_samples"
    # Added by revision 0002: the forecaster reads a job's samples in time order; by 0005: each
    # job's latest sample is one index seek.
    __table_args__ = (Index("ix_throughput_samples_job_pk_time_s", "job_pk", "time_s"),
                      Index("ix_throughput_samples_job_pk_id", "job_pk", "id"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_pk: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    time_s: Mapped[float] = mapped_column(Float)
    samples_per_s: Mapped[float] = mapped_column(Float)
    batch_size: Mapped[int] = mapped_column(Integer)
    gpus: Mapped[int] = mapped_column(Integer)


class BatchSizeChange(Base):
    """A batch-size change the scheduler observed (the adaptation history)."""

    __tablename__ = "batch_size_changes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_pk: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    time_s: Mapped[float] = mapped_column(Float)
    old_batch_size: Mapped[int] = mapped_column(Integer)
    new_batch_size: Mapped[int] = mapped_column(Integer)


class Checkpoint(Base):
    """A checkpoint a job wrote (or failed to write) before a preemption or at a step."""

    __tablename__ = "checkpoints"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_pk: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    time_s: Mapped[float] = mapped_column(Float)
    path: Mapped[str] = mapped_column(Text)
    step: Mapped[int] = mapped_column(BigInteger)
    ok: Mapped[bool] = mapped_column(Boolean)
