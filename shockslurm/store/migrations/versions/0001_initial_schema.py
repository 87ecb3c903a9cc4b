"""The first schema: runs, jobs, job events, rounds, plan entries, enactment intents,
throughput samples, batch-size changes, checkpoints.

Written out in full (not `create_all`) so this revision keeps meaning the same tables when the
models move on.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def _fk(column: str, table: str, target: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint([column], [f"{target}.id"], ondelete="CASCADE",
                                   name=f"fk_{table}_{column}_{target}")


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("cluster", sa.String(128), nullable=False),
        sa.Column("policy", sa.String(64), nullable=False),
        sa.Column("started_at", TZ, nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("submit_s", sa.Float(), nullable=False),
        sa.Column("owner", sa.String(128), nullable=True),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("epochs", sa.Integer(), nullable=False),
        sa.Column("samples_per_epoch", sa.BigInteger(), nullable=False),
        sa.Column("batch_sizes", sa.JSON(), nullable=False),
        sa.Column("gang_size", sa.Integer(), nullable=False),
        _fk("run_id", "jobs", "runs"),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
        sa.UniqueConstraint("run_id", "job_id", "submit_s", name="uq_jobs_run_id_job_id_submit_s"),
    )
    op.create_table(
        "job_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_pk", sa.Integer(), nullable=False),
        sa.Column("time_s", sa.Float(), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        _fk("job_pk", "job_events", "jobs"),
        sa.PrimaryKeyConstraint("id", name="pk_job_events"),
    )
    op.create_index("ix_job_events_job_pk", "job_events", ["job_pk"])
    op.create_table(
        "rounds",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("round_index", sa.Integer(), nullable=False),
        sa.Column("time_s", sa.Float(), nullable=False),
        sa.Column("policy", sa.String(64), nullable=False),
        sa.Column("solve_s", sa.Float(), nullable=False),
        sa.Column("status", sa.String(32), nullable=True),
        sa.Column("objective", sa.Float(), nullable=True),
        _fk("run_id", "rounds", "runs"),
        sa.PrimaryKeyConstraint("id", name="pk_rounds"),
        sa.UniqueConstraint("run_id", "round_index", name="uq_rounds_run_id_round_index"),
    )
    op.create_table(
        "plan_entries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("job_pk", sa.Integer(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        _fk("round_id", "plan_entries", "rounds"),
        _fk("job_pk", "plan_entries", "jobs"),
        sa.PrimaryKeyConstraint("id", name="pk_plan_entries"),
        sa.UniqueConstraint("round_id", "job_pk", name="uq_plan_entries_round_id_job_pk"),
    )
    op.create_table(
        "enactment_intents",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("job_pk", sa.Integer(), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("argv", sa.JSON(), nullable=False),
        sa.Column("return_code", sa.Integer(), nullable=True),
        sa.Column("stderr", sa.Text(), nullable=True),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("finished_at", TZ, nullable=True),
        _fk("round_id", "enactment_intents", "rounds"),
        _fk("job_pk", "enactment_intents", "jobs"),
        sa.PrimaryKeyConstraint("id", name="pk_enactment_intents"),
    )
    op.create_index("ix_enactment_intents_round_id", "enactment_intents", ["round_id"])
    op.create_table(
        "throughput_samples",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_pk", sa.Integer(), nullable=False),
        sa.Column("time_s", sa.Float(), nullable=False),
        sa.Column("samples_per_s", sa.Float(), nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        _fk("job_pk", "throughput_samples", "jobs"),
        sa.PrimaryKeyConstraint("id", name="pk_throughput_samples"),
    )
    op.create_table(
        "batch_size_changes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_pk", sa.Integer(), nullable=False),
        sa.Column("time_s", sa.Float(), nullable=False),
        sa.Column("old_batch_size", sa.Integer(), nullable=False),
        sa.Column("new_batch_size", sa.Integer(), nullable=False),
        _fk("job_pk", "batch_size_changes", "jobs"),
        sa.PrimaryKeyConstraint("id", name="pk_batch_size_changes"),
    )
    op.create_index("ix_batch_size_changes_job_pk", "batch_size_changes", ["job_pk"])
    op.create_table(
        "checkpoints",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_pk", sa.Integer(), nullable=False),
        sa.Column("time_s", sa.Float(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("ok", sa.Boolean(), nullable=False),
        _fk("job_pk", "checkpoints", "jobs"),
        sa.PrimaryKeyConstraint("id", name="pk_checkpoints"),
    )
    op.create_index("ix_checkpoints_job_pk", "checkpoints", ["job_pk"])


def downgrade() -> None:
    for table in ("checkpoints", "batch_size_changes", "throughput_samples", "enactment_intents",
                  "plan_entries", "rounds", "job_events", "jobs", "runs"):
        op.drop_table(table)
