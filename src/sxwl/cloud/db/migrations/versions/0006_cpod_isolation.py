"""CPods say whether their agent isolates jobs, and whose jobs one that does not may run.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing CPods were placed as if isolated; their agents report the truth at their next start.
    with op.batch_alter_table("cpods") as batch:
        batch.add_column(sa.Column("isolation", sa.String(16), nullable=False, server_default="isolated"))
        batch.add_column(
            sa.Column("trusted_owner_ids", sa.JSON, nullable=False, server_default=sa.text("'[]'"))
        )


def downgrade() -> None:
    with op.batch_alter_table("cpods") as batch:
        batch.drop_column("trusted_owner_ids")
        batch.drop_column("isolation")
