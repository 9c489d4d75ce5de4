"""Shared state (docs/replica-state.md): the login and registration limits count their events in
``rate_events``, so that replicas share them (limits kept in memory before this revision start
empty), and ``key_checks`` lets a replica started with another SXWL_SECRET_KEY see it and refuse.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rate_events",
        # SQLite numbers rows itself only for a column declared exactly INTEGER PRIMARY KEY.
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True
        ),
        sa.Column("key", sa.LargeBinary(32), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_rate_events_key_expires_at", "rate_events", ["key", "expires_at"])
    op.create_index("ix_rate_events_expires_at", "rate_events", ["expires_at"])
    op.create_table(
        "key_checks",
        sa.Column("purpose", sa.String(64), primary_key=True),
        sa.Column("digest", sa.LargeBinary(32), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("key_checks")
    op.drop_index("ix_rate_events_expires_at", table_name="rate_events")
    op.drop_index("ix_rate_events_key_expires_at", table_name="rate_events")
    op.drop_table("rate_events")
