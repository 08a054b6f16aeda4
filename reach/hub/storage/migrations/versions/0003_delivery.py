"""delivery: attempt bookkeeping, dispatch leases and deadlines on tasks

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_INT_COLUMNS = ("retries", "redeliveries", "deferrals")
_FLOAT_COLUMNS = (
    "next_attempt_at",
    "lease_until",
    "last_published_at",
    "accepted_at",
    "finished_at",
)


def upgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        for name in _INT_COLUMNS:
            batch_op.add_column(sa.Column(name, sa.Integer(), nullable=False, server_default="0"))
        for name in _FLOAT_COLUMNS:
            batch_op.add_column(sa.Column(name, sa.Double(), nullable=True))
        batch_op.add_column(sa.Column("lease_token", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("callback_url", sa.String(length=512), nullable=True))
        batch_op.create_index("ix_tasks_status_next_attempt", ["status", "next_attempt_at"])
    with op.batch_alter_table("dead_letters", schema=None) as batch_op:
        batch_op.add_column(sa.Column("target", sa.JSON(), nullable=False, server_default="{}"))


def downgrade() -> None:
    with op.batch_alter_table("dead_letters", schema=None) as batch_op:
        batch_op.drop_column("target")
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_index("ix_tasks_status_next_attempt")
        for name in ("callback_url", "lease_token", *_FLOAT_COLUMNS, *_INT_COLUMNS):
            batch_op.drop_column(name)
