"""listing indexes: the operator's task and DAG-run lists, newest first, without a scan

``GET /api/v1/tasks`` and ``GET /api/v1/dag-runs`` page by keyset on (created_at, id)
descending (`reach.hub.ops.listings`): without these, every page (filtered by a common
status or method, or not at all) read and sorted the whole table. The rarer filters
(agent, session) keep their own indexes.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_tasks_created", "tasks", ["created_at", "id"])
    op.create_index("ix_dag_runs_created", "dag_runs", ["created_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_dag_runs_created", table_name="dag_runs")
    op.drop_index("ix_tasks_created", table_name="tasks")
