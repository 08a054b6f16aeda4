"""retention: indexes that let the clean-up find old rows without scanning whole tables

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-07
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# (index, table, columns): each retention query walks one of these from its oldest end
INDEXES = [
    ("ix_tasks_finished_at", "tasks", ["finished_at"]),
    ("ix_outbox_task_id", "outbox", ["task_id"]),
    ("ix_instance_events_at", "instance_events", ["at"]),
    ("ix_dead_letters_replayed_at", "dead_letters", ["replayed_at"]),
    ("ix_dag_runs_finished_at", "dag_runs", ["finished_at"]),
    ("ix_broadcasts_deadline", "broadcasts", ["deadline"]),
    ("ix_instances_status_changed", "instances", ["status", "status_changed_at"]),
]


def upgrade() -> None:
    for name, table, columns in INDEXES:
        op.create_index(name, table, columns)


def downgrade() -> None:
    for name, table, _ in reversed(INDEXES):
        op.drop_index(name, table_name=table)
