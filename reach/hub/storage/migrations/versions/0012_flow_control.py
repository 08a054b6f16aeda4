"""flow control: priority, per-agent queue bounds, sessions, hub-wide windows, links

* ``tasks.priority`` (online | background) picks the delivery queue; ``(agent_id,
  status)`` counts an agent's pending + in-flight tasks for its queue bound and
  ``(session_id, status)`` finds a closed session's live reaches; ``(priority, status,
  next_attempt_at)`` tells a background delivery whether online work waits.
* ``agents.max_queue`` is the bound an agent declared at registration,
  ``max_queue_override`` an admin's (it wins); both unset: ``router.max_queue``.
* ``sessions``: session liveness (open with a TTL, closed by a caller or an admin).
* ``flow_counts``: hub-wide sliding windows (retry budgets, breaker outcomes, reach
  counts per agent pair), one row per (name, key, second bucket), summed over a window.
* ``agent_links``: an ordered agent pair suspected of a dependency loop, demoted until
  it calms.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-15
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(
            sa.Column("priority", sa.String(length=16), nullable=False, server_default="online")
        )
    op.create_index("ix_tasks_agent_status", "tasks", ["agent_id", "status"])
    op.create_index("ix_tasks_session_status", "tasks", ["session_id", "status"])
    op.create_index("ix_tasks_priority_status", "tasks", ["priority", "status", "next_attempt_at"])
    with op.batch_alter_table("agents") as batch:
        batch.add_column(sa.Column("max_queue", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("max_queue_override", sa.Integer(), nullable=True))
    op.create_table(
        "sessions",
        sa.Column("session_id", sa.String(length=128), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("owner", sa.String(length=160), nullable=True),
        sa.Column("opened_at", sa.Double(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=True),
        sa.Column("closed_at", sa.Double(), nullable=True),
        sa.Column("closed_by", sa.String(length=160), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("session_id"),
    )
    op.create_table(
        "flow_counts",
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("key", sa.String(length=300), nullable=False),
        sa.Column("bucket", sa.Integer(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("name", "key", "bucket"),
    )
    op.create_index("ix_flow_counts_bucket", "flow_counts", ["bucket"])
    op.create_table(
        "agent_links",
        sa.Column("src", sa.String(length=128), nullable=False),
        sa.Column("dst", sa.String(length=128), nullable=False),
        sa.Column("suspected_at", sa.Double(), nullable=True),
        sa.Column("demoted_until", sa.Double(), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("src", "dst"),
    )


def downgrade() -> None:
    op.drop_table("agent_links")
    op.drop_index("ix_flow_counts_bucket", table_name="flow_counts")
    op.drop_table("flow_counts")
    op.drop_table("sessions")
    with op.batch_alter_table("agents") as batch:
        batch.drop_column("max_queue_override")
        batch.drop_column("max_queue")
    op.drop_index("ix_tasks_priority_status", table_name="tasks")
    op.drop_index("ix_tasks_session_status", table_name="tasks")
    op.drop_index("ix_tasks_agent_status", table_name="tasks")
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("priority")
