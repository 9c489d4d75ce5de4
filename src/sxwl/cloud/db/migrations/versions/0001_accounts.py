"""Accounts, sessions and accessKeys.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("email", sa.String(320), nullable=False, unique=True),
        sa.Column("password_hash", sa.String(255), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("name", sa.String(100)),
        sa.Column("company", sa.String(200)),
        sa.Column("phone", sa.String(32)),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("password_changed_at", TS, nullable=False),
    )
    op.create_table(
        "auth_sessions",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("user_id", sa.String(32), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("expires_at", TS, nullable=False),
        sa.Column("revoked_at", TS),
    )
    op.create_index("ix_auth_sessions_user_id", "auth_sessions", ["user_id"])
    op.create_table(
        "access_keys",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("user_id", sa.String(32), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("key_encrypted", sa.String(512), nullable=False),
        sa.Column("hint", sa.String(8), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("created_by_id", sa.String(32), sa.ForeignKey("users.id", ondelete="SET NULL")),
        sa.Column("revoked_at", TS),
        sa.Column("revoked_by_id", sa.String(32), sa.ForeignKey("users.id", ondelete="SET NULL")),
    )
    op.create_index("ix_access_keys_user_active", "access_keys", ["user_id", "revoked_at"])


def downgrade() -> None:
    op.drop_table("access_keys")
    op.drop_table("auth_sessions")
    op.drop_table("users")
