"""Indexes for the lookups a daemon makes every round, so that a round costs the same after
months of history: each job's latest report of a kind (`reports.reported_progress`: a job
reporting every 10 s had its whole history read each round, 0.4 s a round for 50 jobs after a
day) and the stops under way, read by Slurm job id (`daemon.journal`: the whole intents table).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

INDEXES = (("ix_job_events_job_pk_kind_id", "job_events", ["job_pk", "kind", "id"]),
           ("ix_throughput_samples_job_pk_id", "throughput_samples", ["job_pk", "id"]),
           ("ix_enactment_intents_job_pk", "enactment_intents", ["job_pk"]),
           ("ix_jobs_job_id", "jobs", ["job_id"]))


def upgrade() -> None:
    for name, table, columns in INDEXES:
        op.create_index(name, table, columns)


def downgrade() -> None:
    for name, table, _ in reversed(INDEXES):
        op.drop_index(name, table_name=table)
