"""outbox.claimed_at: the relay's open claims, in a partial index of their own

The relay claims an outbox row by marking it published, and a claim never settled (the
relay died between claim and publish) must lapse and be claimed again. That net found
its rows by joining every published outbox row to its task: a read that grows with the
table, fast only while the planner's statistics are fresh (measured on a never-analysed
server: 0.4 -> 32 ms a call, once a second, over a 30-minute soak). A claim now also
writes ``claimed_at`` and settling clears it, so the partial index holds only the open
claims, and the net reads them whatever the statistics say.

Claims open at upgrade time (published rows of tasks still pending at that attempt and
never published since) are carried over, so none is stranded by the change. The
predicate is frozen here as written; the models' ``OPEN_CLAIM`` must equal it (a migration
test checks the models against the migrations).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

OPEN_CLAIM = "claimed_at IS NOT NULL"


def upgrade() -> None:
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.add_column(sa.Column("claimed_at", sa.Double(), nullable=True))
    op.execute(
        "UPDATE outbox SET claimed_at = published_at WHERE published_at IS NOT NULL AND "
        "EXISTS (SELECT 1 FROM tasks WHERE tasks.task_id = outbox.task_id "
        "AND tasks.status = 'pending' AND tasks.attempt_seq = outbox.attempt_seq "
        "AND (tasks.last_published_at IS NULL "
        "OR tasks.last_published_at < outbox.published_at))"
    )
    op.create_index(
        "ix_outbox_claimed",
        "outbox",
        ["claimed_at"],
        postgresql_where=sa.text(OPEN_CLAIM),
        sqlite_where=sa.text(OPEN_CLAIM),
    )


def downgrade() -> None:
    op.drop_index("ix_outbox_claimed", table_name="outbox")
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.drop_column("claimed_at")
