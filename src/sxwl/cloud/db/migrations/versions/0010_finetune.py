"""Fine-tuning (docs/finetune.md): uploaded files, the model catalogue, fine-tunes with their events
and checkpoints; a job's inputs and trainer spec; the inputs a CPod keeps in its cache.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("inputs", sa.JSON(), nullable=False, server_default="[]"))
        batch.add_column(sa.Column("trainer", sa.JSON(), nullable=True))
    with op.batch_alter_table("cpods") as batch:
        batch.add_column(sa.Column("cached_inputs", sa.JSON(), nullable=False, server_default="[]"))
    op.create_table(
        "data_files",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("owner_id", sa.String(32), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("filename", sa.String(255), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("format", sa.String(24)),
        sa.Column("examples", sa.Integer(), nullable=False),
        sa.Column("problems", sa.JSON(), nullable=False),
        sa.Column("problem_count", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("created_at", _WHEN, nullable=False),
    )
    op.create_index("ix_data_files_owner_created", "data_files", ["owner_id", "created_at"])
    op.create_table(
        "catalog_models",
        sa.Column("id", sa.String(200), primary_key=True),
        sa.Column("owner_id", sa.String(32), sa.ForeignKey("users.id", ondelete="CASCADE")),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("base_model_id", sa.String(200), sa.ForeignKey("catalog_models.id", ondelete="RESTRICT")),
        sa.Column("architecture", sa.String(100)),
        sa.Column("parameters", sa.BigInteger()),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("object", sa.JSON(), nullable=False),
        sa.Column("fine_tune_id", sa.String(40)),
        sa.Column("created_at", _WHEN, nullable=False),
    )
    op.create_index("ix_catalog_models_owner_id", "catalog_models", ["owner_id"])
    op.create_table(
        "fine_tunes",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("owner_id", sa.String(32), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
        sa.Column(
            "job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False, unique=True
        ),
        sa.Column(
            "model", sa.String(200), sa.ForeignKey("catalog_models.id", ondelete="RESTRICT"), nullable=False
        ),
        sa.Column(
            "training_file",
            sa.String(40),
            sa.ForeignKey("data_files.id", ondelete="RESTRICT"),
            nullable=False,
        ),
        sa.Column("validation_file", sa.String(40), sa.ForeignKey("data_files.id")),
        sa.Column("hyperparameters", sa.JSON(), nullable=False),
        sa.Column("lora", sa.JSON(), nullable=False),
        sa.Column("suffix", sa.String(64)),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("max_cost", sa.BigInteger()),
        sa.Column("fine_tuned_model", sa.String(200)),
        sa.Column("created_at", _WHEN, nullable=False),
        sa.Column("finished_at", _WHEN),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("total_steps", sa.BigInteger(), nullable=False),
        sa.Column("loss", sa.Float()),
        sa.Column("eval_loss", sa.Float()),
        sa.Column("tokens_per_s", sa.Float()),
        sa.Column("trained_tokens", sa.BigInteger()),
        sa.Column("progress_at", _WHEN),
        sa.Column("parsed_attempt", sa.Integer(), nullable=False),
        sa.Column("parsed_offset", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_fine_tunes_owner_created", "fine_tunes", ["owner_id", "created_at"])
    op.create_table(
        "fine_tune_events",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "fine_tune_id", sa.String(40), sa.ForeignKey("fine_tunes.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("at", _WHEN, nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("level", sa.String(8), nullable=False),
        sa.Column("type", sa.String(16), nullable=False),
        sa.Column("message", sa.String(500), nullable=False),
        sa.Column("data", sa.JSON()),
    )
    op.create_index("ix_fine_tune_events_fine_tune_id", "fine_tune_events", ["fine_tune_id"])
    op.create_table(
        "fine_tune_checkpoints",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column(
            "fine_tune_id", sa.String(40), sa.ForeignKey("fine_tunes.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("path", sa.String(1024), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("created_at", _WHEN, nullable=False),
        sa.UniqueConstraint("fine_tune_id", "attempt", "path", name="uq_fine_tune_checkpoints"),
    )
    op.create_index("ix_fine_tune_checkpoints_fine_tune_id", "fine_tune_checkpoints", ["fine_tune_id"])


def downgrade() -> None:
    for table in ("fine_tune_checkpoints", "fine_tune_events", "fine_tunes", "catalog_models", "data_files"):
        op.drop_table(table)
    # Plain ALTER TABLE … DROP COLUMN (SQLite 3.35+): a batch would recreate "jobs", which other
    # tables reference.
    op.drop_column("cpods", "cached_inputs")
    op.drop_column("jobs", "trainer")
    op.drop_column("jobs", "inputs")
