"""callbacks: the hub POSTs a task's result (and progress if asked) to the caller's URL

* ``callbacks``: one ``result`` row per task that asked for a callback, written in the
  same transaction as the submission (status ``waiting``: the intent, with the URL and
  context) and armed in the transaction that makes the task terminal (``waiting`` ->
  ``due``), so a crash between the terminal state and the POST cannot lose it. When the
  caller asked for progress, one ``progress`` row per progress event (``body``: the
  report), written with the event. A Celery task POSTs a due row; a beat net
  re-publishes due rows whose publish was lost. After ``callbacks.max_retries`` failed
  POSTs a row is dead-lettered (status ``dead``, ``last_error`` kept).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-16
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "callbacks",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("task_id", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False, server_default="result"),
        sa.Column("event_id", sa.Integer(), nullable=True),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("context", sa.JSON(), nullable=True),
        sa.Column("body", sa.JSON(), nullable=True),
        sa.Column("progress", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("next_attempt_at", sa.Double(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("delivered_at", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_callbacks_task_id", "callbacks", ["task_id"])
    op.create_index("ix_callbacks_status_next", "callbacks", ["status", "next_attempt_at"])


def downgrade() -> None:
    op.drop_index("ix_callbacks_status_next", table_name="callbacks")
    op.drop_index("ix_callbacks_task_id", table_name="callbacks")
    op.drop_table("callbacks")
