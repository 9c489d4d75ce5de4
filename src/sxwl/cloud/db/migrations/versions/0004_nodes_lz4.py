"""PostgreSQL: CPod node snapshots compressed with lz4 instead of pglz.

Every heartbeat rewrites its CPod's ~10 KB snapshot, which PostgreSQL compresses when it moves it out
of line; pglz cost the database more CPU per heartbeat than the rest of the update. SQLite does not
compress, so there is nothing to do there; neither is there on a PostgreSQL without lz4.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


# PostgreSQL 14+ built with lz4 lists it among this setting's values (Debian's and most others are).
HAS_LZ4 = sa.text(
    "SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY(enumvals)"
)


def _lz4_available() -> bool:
    bind = op.get_bind()
    return bind.dialect.name == "postgresql" and bind.execute(HAS_LZ4).first() is not None


def upgrade() -> None:
    if _lz4_available():
        op.execute("ALTER TABLE cpods ALTER COLUMN nodes SET COMPRESSION lz4")


def downgrade() -> None:
    if _lz4_available():
        op.execute("ALTER TABLE cpods ALTER COLUMN nodes SET COMPRESSION pglz")
