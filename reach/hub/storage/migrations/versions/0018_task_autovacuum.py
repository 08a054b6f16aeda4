"""autovacuum for the task tables: vacuumed after 2 % of their rows changed, not 20 %

Every task's status changes twice or three times, and each change leaves a dead row
version and a dead entry in every index on ``status``. Every submit counts its agent's
live tasks (``ix_tasks_agent_status``, `reach.hub.flow.admission`), and that count walks the
dead entries left since the last vacuum. PostgreSQL's default vacuums a table after 20 %
of its rows died: on a task table of 1,000,000 rows that is 200,000 dead versions under
every submit's count before the first vacuum. 2 % (plus 1,000 rows, so a small table is
not vacuumed on every nap) bounds it at a minute or two of traffic. Planner statistics
follow at the same pace. PostgreSQL only: SQLite has no autovacuum to tune.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

TABLES = ("tasks", "outbox")
OPTIONS = {
    "autovacuum_vacuum_scale_factor": "0.02",
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_analyze_scale_factor": "0.02",
}


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    options = ", ".join(f"{name} = {value}" for name, value in OPTIONS.items())
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} SET ({options})")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} RESET ({', '.join(OPTIONS)})")
