"""Which replica holds each CPod's tunnel (docs/tunnel.md): ``tunnel_replicas`` (each live cloud
process, where the others reach it, renewed while it runs) and ``tunnel_holders`` (which of them
holds connections of which CPod). A replica that receives a request for a CPod whose tunnel another
replica holds relays it there.

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tunnel_replicas",
        sa.Column("replica", sa.String(32), primary_key=True),
        sa.Column("url", sa.String(500), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "tunnel_holders",
        sa.Column("cpod_id", sa.String(32), sa.ForeignKey("cpods.id", ondelete="CASCADE"), primary_key=True),
        sa.Column(
            "replica",
            sa.String(32),
            sa.ForeignKey("tunnel_replicas.replica", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("connections", sa.Integer, nullable=False),
    )
    op.create_index("ix_tunnel_holders_replica", "tunnel_holders", ["replica"])


def downgrade() -> None:
    op.drop_index("ix_tunnel_holders_replica", "tunnel_holders")
    op.drop_table("tunnel_holders")
    op.drop_table("tunnel_replicas")
