"""Per-job report key: the HMAC key a job's training reports are signed with.

`shocksub` hands the job a random secret (in its environment only) and registers the key derived
from it (`train.records.derive_key`), never the secret itself. NULL for jobs registered before
this revision (their reports are unsigned: refused unless `allow_unsigned_reports`).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("report_key", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("report_key")
