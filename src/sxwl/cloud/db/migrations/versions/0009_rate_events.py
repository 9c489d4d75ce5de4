"""Rate events: the login and registration limits count in the database, so that replicas share
them (docs/replica-state.md). Limits kept in memory before this revision start empty.

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


def downgrade() -> None:
    op.drop_index("ix_rate_events_expires_at", table_name="rate_events")
    op.drop_index("ix_rate_events_key_expires_at", table_name="rate_events")
    op.drop_table("rate_events")
