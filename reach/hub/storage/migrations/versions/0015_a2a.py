"""A2A interop: instances reached over the Agent2Agent protocol, and the remote task id

``instances.protocol`` says how the worker delivers to an instance (``reach``: the SDK's
``POST /tasks/{method}``; ``a2a``: JSON-RPC ``SendMessage``); ``instances.a2a`` keeps what
the hub read from the agent's card (its URL, the JSON-RPC endpoint, streaming, the
security scheme it asks for), and ``instances.a2a_credential`` the secret the hub presents
under that scheme (never shown). ``tasks.remote_task_id`` is the A2A task an attempt
started, which the hub follows with ``GetTask`` while it works.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("instances") as batch:
        batch.add_column(
            sa.Column("protocol", sa.String(16), nullable=False, server_default="reach")
        )
        batch.add_column(sa.Column("a2a", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("a2a_credential", sa.Text(), nullable=True))
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("remote_task_id", sa.String(256), nullable=True))
    # the follow sweep's scan: executing or waiting tasks an A2A agent works on
    op.create_index("ix_tasks_remote_status", "tasks", ["status", "remote_task_id"])


def downgrade() -> None:
    op.drop_index("ix_tasks_remote_status", table_name="tasks")
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("remote_task_id")
    with op.batch_alter_table("instances") as batch:
        batch.drop_column("a2a_credential")
        batch.drop_column("a2a")
        batch.drop_column("protocol")
