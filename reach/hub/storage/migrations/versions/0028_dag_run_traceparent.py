"""dag_runs.traceparent: the W3C trace context of a DAG run's span

A run's nodes are submitted by workers long after the run was started; the run's span
context is kept with it so that every node's task is a child of the run (one trace per
run, ``reach.hub.tracing``). NULL: the run was started untraced.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("dag_runs") as batch:
        batch.add_column(sa.Column("traceparent", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("dag_runs") as batch:
        batch.drop_column("traceparent")
