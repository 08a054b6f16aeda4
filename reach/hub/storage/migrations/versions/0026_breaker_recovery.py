"""instances.breaker_closed_at: when a successful trial closed the breaker

Gradual recovery (``reach.core.flow.breakers.recovery_share``): for
``router.breaker_recovery_windows``
windows after it the instance takes a growing share of its tasks, and a failure in that
time opens the breaker again at once.

Revision ID: 0026
Revises: 0023
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.add_column(sa.Column("breaker_closed_at", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.drop_column("breaker_closed_at")
