"""Drop the tasks indexes that are prefixes of others: ``ix_tasks_status`` (status leads
``ix_tasks_status_next_attempt`` and ``ix_tasks_remote_status``) and ``ix_tasks_agent_id``
(agent_id leads ``ix_tasks_agent_status``). Every query they served is served as well by
the longer index, and every status change of every task paid for keeping them.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_tasks_status", table_name="tasks")
    op.drop_index("ix_tasks_agent_id", table_name="tasks")


def downgrade() -> None:
    op.create_index("ix_tasks_agent_id", "tasks", ["agent_id"])
    op.create_index("ix_tasks_status", "tasks", ["status"])
