"""The database keeps the "only one" rules: one active accessKey per provider, one open attempt per job.

SQLite has no row locks, so these rules, kept until now by reading first and writing after, did not
hold under concurrent requests there. A partial unique index (both engines have them) makes a second
active key or open attempt impossible. A database that already holds duplicates is cleaned first, the
same way every time: a provider keeps its newest active key (by creation time, then id) and the
others are revoked; a job keeps its highest open attempt and the others are closed as lost.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

ACTIVE_KEY = "revoked_at IS NULL"
OPEN_ATTEMPT = "finished_at IS NULL"

# Correlated subqueries rather than window functions or UPDATE ... FROM: the same SQL on both engines.
REVOKE_OLDER_KEYS = sa.text(
    """
    UPDATE access_keys SET revoked_at = :now
    WHERE revoked_at IS NULL AND EXISTS (
        SELECT 1 FROM access_keys AS newer
        WHERE newer.user_id = access_keys.user_id AND newer.revoked_at IS NULL
          AND (newer.created_at > access_keys.created_at
               OR (newer.created_at = access_keys.created_at AND newer.id > access_keys.id))
    )
    """
)
CLOSE_OLDER_ATTEMPTS = sa.text(
    """
    UPDATE job_attempts SET finished_at = :now, outcome = 'lost'
    WHERE finished_at IS NULL AND EXISTS (
        SELECT 1 FROM job_attempts AS later
        WHERE later.job_id = job_attempts.job_id AND later.finished_at IS NULL
          AND later.attempt > job_attempts.attempt
    )
    """
)


def upgrade() -> None:
    # Typed, so that SQLite gets the same text form as every other timestamp column.
    now = sa.bindparam("now", datetime.now(UTC), type_=sa.DateTime(timezone=True))
    op.execute(REVOKE_OLDER_KEYS.bindparams(now))
    op.execute(CLOSE_OLDER_ATTEMPTS.bindparams(now))
    for name, table, column, where in (
        ("uq_access_keys_one_active", "access_keys", "user_id", ACTIVE_KEY),
        ("uq_job_attempts_one_open", "job_attempts", "job_id", OPEN_ATTEMPT),
    ):
        condition = sa.text(where)
        op.create_index(
            name, table, [column], unique=True, sqlite_where=condition, postgresql_where=condition
        )


def downgrade() -> None:
    op.drop_index("uq_job_attempts_one_open", table_name="job_attempts")
    op.drop_index("uq_access_keys_one_active", table_name="access_keys")
