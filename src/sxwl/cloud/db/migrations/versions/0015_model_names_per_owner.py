"""Model names are per owner: ``catalog_models.name``, unique among the public models and among each
user's own, beside the row's key ``id`` (until now the name itself, one namespace for every user, so
a private name blocked everyone else's and revealed itself by the conflict). ``fine_tunes.model_name``
keeps the base model's name as the user gave it. Existing rows keep their ids; their names are their
ids (docs/finetune.md, "Models").

Unique indexes, not a table constraint, and columns added in place: SQLite would rebuild the table
for a constraint, and dropping the old ``catalog_models`` fails while fine-tunes refer to it.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

PUBLIC = "owner_id IS NULL"


def upgrade() -> None:
    # The server default only fills the rows that are there now, before they are given their names.
    op.add_column("catalog_models", sa.Column("name", sa.String(200), nullable=False, server_default=""))
    op.execute("UPDATE catalog_models SET name = id")
    op.create_index("uq_catalog_models_owner_name", "catalog_models", ["owner_id", "name"], unique=True)
    op.create_index(
        "uq_catalog_models_public_name",
        "catalog_models",
        ["name"],
        unique=True,
        sqlite_where=sa.text(PUBLIC),
        postgresql_where=sa.text(PUBLIC),
    )
    op.add_column("fine_tunes", sa.Column("model_name", sa.String(200), nullable=False, server_default=""))
    op.execute("UPDATE fine_tunes SET model_name = model")


def downgrade() -> None:
    op.drop_column("fine_tunes", "model_name")
    op.drop_index("uq_catalog_models_public_name", "catalog_models")
    op.drop_index("uq_catalog_models_owner_name", "catalog_models")
    op.drop_column("catalog_models", "name")
