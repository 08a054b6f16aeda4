"""capability embeddings: semantic matching's vectors, stored with the declaration

Each declared capability (``agent_capabilities``) keeps the vectors of its texts (type,
description, examples) as computed at registration, with the digest of the model and
texts they came from, so every API replica has them without running the model on them
again (`reach.hub.fleet.matching`).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("agent_capabilities") as batch:
        batch.add_column(sa.Column("embedding_digest", sa.String(64), nullable=True))
        batch.add_column(sa.Column("embedding", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("agent_capabilities") as batch:
        batch.drop_column("embedding")
        batch.drop_column("embedding_digest")
