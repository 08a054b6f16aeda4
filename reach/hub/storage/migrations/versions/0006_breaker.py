"""per-instance circuit breaker: open until, last opened at

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.add_column(sa.Column("breaker_open_until", sa.Double(), nullable=True))
        batch_op.add_column(sa.Column("breaker_opened_at", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.drop_column("breaker_opened_at")
        batch_op.drop_column("breaker_open_until")
