"""Inference endpoints (docs/endpoints.md): ``endpoints``, their replicas (each a job of the
endpoint kind, whose ``jobs.engine`` holds the engine it serves) and ``endpoint_usage``, the
requests and tokens each answered per credential and day, and ``inference_keys`` (``sk-…``, hashed).

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None
_WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column("jobs", sa.Column("engine", sa.JSON, nullable=True))
    op.create_table(
        "endpoints",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("owner_id", sa.String(32), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("model_name", sa.String(200), nullable=False),
        sa.Column(
            "base_model_id",
            sa.String(200),
            sa.ForeignKey("catalog_models.id", ondelete="RESTRICT"),
            nullable=False,
        ),
        sa.Column("adapter_id", sa.String(200), sa.ForeignKey("catalog_models.id", ondelete="RESTRICT")),
        sa.Column("gpu_product", sa.String(128)),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("replicas", sa.Integer, nullable=False),
        sa.Column("max_model_len", sa.Integer),
        sa.Column("engine_args", sa.JSON, nullable=False),
        sa.Column("created_at", _WHEN, nullable=False),
        sa.Column("ready_at", _WHEN),
        sa.Column("stopped_at", _WHEN),
    )
    op.create_index("ix_endpoints_owner_created", "endpoints", ["owner_id", "created_at"])
    where = sa.text("stopped_at IS NULL")
    op.create_index(
        "uq_endpoints_owner_name",
        "endpoints",
        ["owner_id", "name"],
        unique=True,
        sqlite_where=where,
        postgresql_where=where,
    )
    op.create_table(
        "endpoint_replicas",
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column(
            "endpoint_id", sa.String(40), sa.ForeignKey("endpoints.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("replica", sa.Integer, nullable=False),
    )
    op.create_index("ix_endpoint_replicas_endpoint_id", "endpoint_replicas", ["endpoint_id"])
    op.create_table(
        "endpoint_usage",
        sa.Column(
            "endpoint_id", sa.String(40), sa.ForeignKey("endpoints.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("key_id", sa.String(40), primary_key=True),
        sa.Column("day", sa.String(10), primary_key=True),
        sa.Column("requests", sa.BigInteger, nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger, nullable=False),
        sa.Column("completion_tokens", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "inference_keys",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("owner_id", sa.String(32), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("prefix", sa.String(12), nullable=False),
        sa.Column("rpm", sa.Integer),
        sa.Column("created_at", _WHEN, nullable=False),
        sa.Column("revoked_at", _WHEN),
    )
    op.create_index("ix_inference_keys_owner_created", "inference_keys", ["owner_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_inference_keys_owner_created", "inference_keys")
    op.drop_table("inference_keys")
    op.drop_table("endpoint_usage")
    op.drop_index("ix_endpoint_replicas_endpoint_id", "endpoint_replicas")
    op.drop_table("endpoint_replicas")
    op.drop_index("uq_endpoints_owner_name", "endpoints")
    op.drop_index("ix_endpoints_owner_created", "endpoints")
    op.drop_table("endpoints")
    op.drop_column("jobs", "engine")
