"""CPods and their event history.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "cpods",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("owner_id", sa.String(32), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("cluster_uid", sa.String(128), nullable=False),
        sa.Column("runtime", sa.String(16), nullable=False),
        sa.Column("agent_version", sa.String(64), nullable=False),
        sa.Column("token_hash", sa.String(64), unique=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("last_heartbeat_at", TS),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
        sa.Column("heartbeat_interval_s", sa.Float, nullable=False),
        sa.Column("revoked_at", TS),
        sa.Column("nodes", sa.JSON, nullable=False),
        sa.UniqueConstraint("owner_id", "cluster_uid", name="uq_cpods_owner_cluster"),
    )
    op.create_index("ix_cpods_owner_id", "cpods", ["owner_id"])
    op.create_table(
        "cpod_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("cpod_id", sa.String(32), sa.ForeignKey("cpods.id", ondelete="CASCADE"), nullable=False),
        sa.Column("at", TS, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("detail", sa.String(500)),
        sa.Column("actor_id", sa.String(32), sa.ForeignKey("users.id", ondelete="SET NULL")),
    )
    op.create_index("ix_cpod_events_cpod_id", "cpod_events", ["cpod_id"])


def downgrade() -> None:
    op.drop_table("cpod_events")
    op.drop_table("cpods")
