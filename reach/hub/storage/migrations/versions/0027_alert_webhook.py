"""alert_mutes and alert_push: muted alert kinds, and the alert webhook's marker

``alert_mutes`` holds the kinds an admin muted; ``alert_push`` one row saying how far the
alert webhook has pushed each source table (``reach.hub.ops.alert_webhook``).

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "alert_mutes",
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("muted_by", sa.String(length=160), nullable=False),
        sa.Column("muted_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("kind"),
    )
    op.create_table(
        "alert_push",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("event_id", sa.Integer(), server_default="0", nullable=False),
        sa.Column("audit_id", sa.Integer(), server_default="0", nullable=False),
        sa.Column("dead_letter_id", sa.Integer(), server_default="0", nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_attempt_at", sa.Double(), nullable=True),
        sa.Column("lease_until", sa.Double(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )


def downgrade() -> None:
    op.drop_table("alert_push")
    op.drop_table("alert_mutes")
