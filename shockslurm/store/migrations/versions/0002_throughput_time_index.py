"""Index throughput samples by (job, time): the forecaster reads a job's samples in time order.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_throughput_samples_job_pk_time_s", "throughput_samples",
                    ["job_pk", "time_s"])


def downgrade() -> None:
    op.drop_index("ix_throughput_samples_job_pk_time_s", table_name="throughput_samples")
