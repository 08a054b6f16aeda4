"""reachability: probe window, score and status reason per instance; instance events

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("probe_window", sa.JSON(), nullable=False, server_default="[]")
        )
        batch_op.add_column(
            sa.Column(
                "probe_status", sa.String(length=16), nullable=False, server_default="unknown"
            )
        )
        batch_op.add_column(sa.Column("rtt_ms", sa.Double(), nullable=True))
        batch_op.add_column(sa.Column("loss_rate", sa.Double(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("last_probe_at", sa.Double(), nullable=True))
        batch_op.add_column(sa.Column("last_probe_error", sa.Text(), nullable=True))
        batch_op.add_column(
            sa.Column("next_probe_at", sa.Double(), nullable=False, server_default="0")
        )
        batch_op.add_column(sa.Column("probe_lease_until", sa.Double(), nullable=True))
        batch_op.add_column(
            sa.Column("reach_score", sa.Double(), nullable=False, server_default="0")
        )
        batch_op.add_column(
            sa.Column("routable", sa.Boolean(), nullable=False, server_default=sa.true())
        )
        batch_op.add_column(
            sa.Column("in_flight_rise_streak", sa.Integer(), nullable=False, server_default="0")
        )
        batch_op.add_column(sa.Column("alerts", sa.JSON(), nullable=False, server_default="[]"))
        batch_op.add_column(
            sa.Column("status_reason", sa.Text(), nullable=False, server_default="")
        )
        batch_op.create_index("ix_instances_next_probe_at", ["next_probe_at"], unique=False)

    op.create_table(
        "instance_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("instance_id", sa.String(length=64), nullable=False),
        sa.Column("agent_id", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.Column("at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("instance_events", schema=None) as batch_op:
        batch_op.create_index("ix_instance_events_instance_at", ["instance_id", "at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("instance_events", schema=None) as batch_op:
        batch_op.drop_index("ix_instance_events_instance_at")
    op.drop_table("instance_events")
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.drop_index("ix_instances_next_probe_at")
        for column in (
            "status_reason",
            "alerts",
            "in_flight_rise_streak",
            "routable",
            "reach_score",
            "probe_lease_until",
            "next_probe_at",
            "last_probe_error",
            "last_probe_at",
            "loss_rate",
            "rtt_ms",
            "probe_status",
            "probe_window",
        ):
            batch_op.drop_column(column)
