"""ix_tasks_agent_live: an agent's live tasks, for the queue count on every submit

The count of an agent's live tasks (`reach.hub.flow.admission`) read ``ix_tasks_agent_status``,
which holds an entry for every version of every task, finished ones included; each
status change adds one. On PostgreSQL this partial index holds only the versions whose
status is live (``pending``, ``dispatching``, ``executing``, ``waiting``): a task that
finishes adds no entry, and an update that leaves ``agent_id`` alone lets PostgreSQL
remove the entries of the row's older versions when a page fills (bottom-up deletion),
before any vacuum. SQLite drops a changed row's old index entries at once, so it keeps
the full index alone. The predicate is frozen here as written; the models' ``LIVE_TASK``
must equal it (a migration test checks the models against the migrations).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

LIVE_TASK = "status IN ('dispatching', 'executing', 'pending', 'waiting')"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return  # SQLite drops a changed row's old index entries at once: nothing to skip
    op.create_index(
        "ix_tasks_agent_live", "tasks", ["agent_id"], postgresql_where=sa.text(LIVE_TASK)
    )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.drop_index("ix_tasks_agent_live", table_name="tasks")
