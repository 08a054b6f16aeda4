"""ui_sign_outs: dashboard sessions signed out before their cookie expires

The dashboard's session cookie is signed and checked without server-side state, so
signing out only asked the browser to forget it: a copy stayed valid for its 8 hours. A
sign-out now records the session id here, and a cookie naming it is refused. A row is
kept until the session would have expired (retention removes it then), so the table holds
at most the sign-outs of the last 8 hours.

Revision ID: 0023
Revises: 0021
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ui_sign_outs",
        sa.Column("sid", sa.String(length=64), primary_key=True),
        sa.Column("key_id", sa.String(length=32), nullable=True),
        sa.Column("signed_out_at", sa.Double(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
    )
    op.create_index("ix_ui_sign_outs_expires", "ui_sign_outs", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_ui_sign_outs_expires", table_name="ui_sign_outs")
    op.drop_table("ui_sign_outs")
