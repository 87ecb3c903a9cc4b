"""Idle GPU-seconds by cause per round (`live.idle`): measured since the previous round, from
the daemon's squeue reads. NULL for rounds recorded before this revision, and for rounds that
measured nothing (simulated runs).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

COLUMNS = ("idle_switch_gpu_s", "idle_unplaceable_gpu_s", "idle_waiting_gpu_s")


def upgrade() -> None:
    for name in COLUMNS:
        op.add_column("rounds", sa.Column(name, sa.Float, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("rounds") as batch:
        for name in COLUMNS:
            batch.drop_column(name)
