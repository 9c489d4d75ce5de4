"""Inference keys' tokens-per-minute and monthly spend limits (docs/endpoints.md, "Keys"):
``inference_keys.tpm`` and ``monthly_cap`` (micro-yuan), and ``inference_key_tokens``, the tokens
each key's answers counted in the last minute, so that every replica reads the same window.

Revision ID: 0019
Revises: 0018
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("inference_keys") as batch:
        batch.add_column(sa.Column("tpm", sa.Integer))
        batch.add_column(sa.Column("monthly_cap", sa.BigInteger))
    op.create_table(
        "inference_key_tokens",
        # SQLite numbers rows itself only for a column declared exactly INTEGER PRIMARY KEY.
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True
        ),
        sa.Column(
            "key_id", sa.String(40), sa.ForeignKey("inference_keys.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("tokens", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_inference_key_tokens_key_at", "inference_key_tokens", ["key_id", "at"])


def downgrade() -> None:
    op.drop_index("ix_inference_key_tokens_key_at", "inference_key_tokens")
    op.drop_table("inference_key_tokens")
    with op.batch_alter_table("inference_keys") as batch:
        batch.drop_column("monthly_cap")
        batch.drop_column("tpm")
