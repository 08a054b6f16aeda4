"""approvals: one human decision per task parked in awaiting_approval

Each row binds the decision to the SHA-256 of the task's payload at the time it was
parked (nothing can change what was approved), records who asked and who decided, and
carries ``expires_at`` so the beat sweep (``(status, expires_at)`` index) fails what
nobody decided in time, across hub restarts.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "approvals",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("approval_id", sa.String(length=64), nullable=False),
        sa.Column("task_id", sa.String(length=128), nullable=False),
        sa.Column("capability", sa.String(length=128), nullable=False),
        sa.Column("agent_id", sa.String(length=128), nullable=True),
        sa.Column("method", sa.String(length=128), nullable=False),
        sa.Column("caller", sa.String(length=160), nullable=True),
        sa.Column("payload_hash", sa.String(length=64), nullable=False),
        sa.Column("requested_at", sa.Double(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("decided_by", sa.String(length=160), nullable=True),
        sa.Column("decided_name", sa.String(length=128), nullable=True),
        sa.Column("decided_at", sa.Double(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("approval_id"),
        sa.UniqueConstraint("task_id"),
    )
    op.create_index("ix_approvals_status_expires", "approvals", ["status", "expires_at"])


def downgrade() -> None:
    op.drop_index("ix_approvals_status_expires", table_name="approvals")
    op.drop_table("approvals")
