"""fleet indexes: hot paths find agents and instances without scanning the fleet

agent_tags / agent_capabilities (what each agent declared, one row per tag or capability,
indexed by it) for submit checks and delivery candidates; the endpoint indexes for the
registration's one-live-instance-per-address check; a partial due index (deregistered
instances left out) and a lease index for the probe claim.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-09
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

PROBED = "status <> 'deregistered'"


def upgrade() -> None:
    op.create_table(
        "agent_tags",
        sa.Column("agent_id", sa.String(length=128), nullable=False),
        sa.Column("tag", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(["agent_id"], ["agents.agent_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("agent_id", "tag"),
    )
    op.create_index("ix_agent_tags_tag", "agent_tags", ["tag", "agent_id"])
    op.create_table(
        "agent_capabilities",
        sa.Column("agent_id", sa.String(length=128), nullable=False),
        sa.Column("capability", sa.String(length=128), nullable=False),
        sa.ForeignKeyConstraint(["agent_id"], ["agents.agent_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("agent_id", "capability"),
    )
    op.create_index(
        "ix_agent_capabilities_capability", "agent_capabilities", ["capability", "agent_id"]
    )
    _backfill()
    op.drop_index("ix_instances_next_probe_at", table_name="instances")
    op.create_index(
        "ix_instances_probe_due",
        "instances",
        ["next_probe_at"],
        sqlite_where=sa.text(PROBED),
        postgresql_where=sa.text(PROBED),
    )
    op.create_index("ix_instances_probe_lease", "instances", ["probe_lease_until"])
    op.create_index("ix_instances_endpoint", "instances", ["endpoint"])
    op.create_index("ix_instances_public_endpoint", "instances", ["public_endpoint"])


def _backfill() -> None:
    """The declarations already registered, copied into the two new tables."""
    bind = op.get_bind()
    agents = sa.table(
        "agents",
        sa.column("agent_id"),
        sa.column("tags", sa.JSON),
        sa.column("capabilities", sa.JSON),
    )
    tags = sa.table("agent_tags", sa.column("agent_id"), sa.column("tag"))
    caps = sa.table("agent_capabilities", sa.column("agent_id"), sa.column("capability"))
    tag_rows, cap_rows = [], []
    for agent_id, agent_tags, capabilities in bind.execute(
        sa.select(agents.c.agent_id, agents.c.tags, agents.c.capabilities)
    ):
        tag_rows += [{"agent_id": agent_id, "tag": t} for t in sorted(set(agent_tags or []))]
        types = {c["type"] for c in capabilities or []}
        cap_rows += [{"agent_id": agent_id, "capability": t} for t in sorted(types)]
    if tag_rows:
        bind.execute(sa.insert(tags), tag_rows)
    if cap_rows:
        bind.execute(sa.insert(caps), cap_rows)


def downgrade() -> None:
    op.drop_index("ix_instances_public_endpoint", table_name="instances")
    op.drop_index("ix_instances_endpoint", table_name="instances")
    op.drop_index("ix_instances_probe_lease", table_name="instances")
    op.drop_index("ix_instances_probe_due", table_name="instances")
    op.create_index("ix_instances_next_probe_at", "instances", ["next_probe_at"])
    op.drop_index("ix_agent_capabilities_capability", table_name="agent_capabilities")
    op.drop_table("agent_capabilities")
    op.drop_index("ix_agent_tags_tag", table_name="agent_tags")
    op.drop_table("agent_tags")
