"""agents.owner: the API key that first registered an agent; api_keys' allow-lists

An agent key may hold many agents (a glob pattern) and each agent many instances: the
hub bounds what one key holds (``registry.max_agents_per_key``,
``registry.max_instances_per_key``) and keeps one agent's address from being taken by
another key's agent. Both need to know which key an agent belongs to. Agents registered
before this revision (or on an open hub) have no owner: None.

``api_keys.allowed_capabilities`` / ``allowed_tags``: fnmatch patterns of what an agent
key's agents may declare (None: anything, as before), set and widened by an admin
(``reach keys allow``), so a key cannot declare another team's tag or capability and
receive its reaches.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.add_column(sa.Column("owner", sa.String(length=64), nullable=True))
    op.create_index("ix_agents_owner", "agents", ["owner"])
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.add_column(sa.Column("allowed_capabilities", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("allowed_tags", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_column("allowed_tags")
        batch_op.drop_column("allowed_capabilities")
    op.drop_index("ix_agents_owner", table_name="agents")
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.drop_column("owner")
