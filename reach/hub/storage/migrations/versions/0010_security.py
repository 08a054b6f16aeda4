"""security: API keys, the hub's signing keys, L3 allow-lists, the audit log, identities

api_keys (id + SHA-256 of the secret, never the secret; scope, agent pattern, expiry,
revocation); signing_keys (the Ed25519 keys that sign reach tokens, with the window in
which each signs and is published); agent_allow_rules (what an L3 agent may call, who may
call it); audit_log (admin actions and refused attempts); and the identity behind each
task, task event, broadcast and DAG run.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("key_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False, server_default=""),
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("agent_pattern", sa.String(length=128), nullable=True),
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=True),
        sa.Column("revoked_at", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("key_id"),
    )
    op.create_table(
        "signing_keys",
        sa.Column("kid", sa.String(length=64), nullable=False),
        sa.Column("algorithm", sa.String(length=16), nullable=False),
        sa.Column("private_pem", sa.Text(), nullable=False),
        sa.Column("public_jwk", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("not_before", sa.Double(), nullable=False),
        sa.Column("retire_after", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("kid"),
    )
    op.create_table(
        "agent_allow_rules",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("agent_id", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("value", sa.String(length=160), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("created_by", sa.String(length=160), nullable=False, server_default=""),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("agent_id", "kind", "value", name="uq_agent_allow_rule"),
    )
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", sa.Double(), nullable=False),
        sa.Column("actor", sa.String(length=160), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("target", sa.String(length=160), nullable=False, server_default=""),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("task_id", sa.String(length=128), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_audit_log_at", "audit_log", ["at"])
    op.create_index("ix_audit_log_task_id", "audit_log", ["task_id"])
    for table in ("tasks", "broadcasts", "dag_runs"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("caller", sa.String(length=160), nullable=True))
    with op.batch_alter_table("task_events") as batch:
        batch.add_column(sa.Column("actor", sa.String(length=160), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("task_events") as batch:
        batch.drop_column("actor")
    for table in ("dag_runs", "broadcasts", "tasks"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("caller")
    op.drop_index("ix_audit_log_task_id", table_name="audit_log")
    op.drop_index("ix_audit_log_at", table_name="audit_log")
    op.drop_table("audit_log")
    op.drop_table("agent_allow_rules")
    op.drop_table("signing_keys")
    op.drop_table("api_keys")
