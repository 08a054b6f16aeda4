"""blobs and tasks.payload_ref: large payloads by reference

``blobs`` holds the records of payload blobs (the bytes live in the blob store,
``reach.hub.blobs``); ``tasks.payload_ref`` names the blob a task carries.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "blobs",
        sa.Column("blob_id", sa.String(length=40), nullable=False),
        sa.Column("owner", sa.String(length=160), nullable=False),
        sa.Column("key_id", sa.String(length=64), nullable=True),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("content_type", sa.String(length=255), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("task_id", sa.String(length=128), nullable=True),
        sa.Column("doomed_at", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("blob_id"),
    )
    op.create_index("ix_blobs_task", "blobs", ["task_id"])
    op.create_index("ix_blobs_created", "blobs", ["created_at"])
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("payload_ref", sa.String(length=40), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("payload_ref")
    op.drop_index("ix_blobs_created", table_name="blobs")
    op.drop_index("ix_blobs_task", table_name="blobs")
    op.drop_table("blobs")
