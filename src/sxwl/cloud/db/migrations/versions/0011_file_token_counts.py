"""Token counts of uploaded files: what each base model's tokenizer made of a file, as the trainer
reported it when a fine-tune of that base tokenized it (docs/finetune.md, "Token counts").

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("data_files") as batch:
        batch.add_column(sa.Column("token_counts", sa.JSON(), nullable=False, server_default="{}"))


def downgrade() -> None:
    op.drop_column("data_files", "token_counts")
