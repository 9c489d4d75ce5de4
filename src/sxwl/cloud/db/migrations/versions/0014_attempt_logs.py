"""Where each job attempt's log stands: ``attempt_logs``.

A log is capped per attempt (what comes past the cap is dropped, with one line that says so) and its
older part moves from ``log_chunks`` into the artifact store, so a long run's log no longer grows
the database (docs/jobs.en.md, "Logs"). The table keeps, per attempt, the bytes its agent sent, the
bytes kept, where dropping began and how much of the kept log lies in the store. Logs written
before are all in ``log_chunks``: their rows say so (nothing archived, nothing dropped).

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "attempt_logs",
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("attempt", sa.Integer, primary_key=True),
        sa.Column("received", sa.BigInteger, nullable=False),
        sa.Column("kept", sa.BigInteger, nullable=False),
        sa.Column("dropped_at", sa.BigInteger, nullable=True),
        sa.Column("archived", sa.BigInteger, nullable=False),
        sa.Column("segment_bytes", sa.BigInteger, nullable=False),
    )
    # Logs written before: all in log_chunks, none dropped; 4 MiB segments (SXWL_LOG_SEGMENT_BYTES's
    # default) once they move to the store.
    op.execute(
        "INSERT INTO attempt_logs (job_id, attempt, received, kept, archived, segment_bytes) "
        'SELECT job_id, attempt, MAX("offset" + LENGTH(data)), MAX("offset" + LENGTH(data)), 0, 4194304 '
        "FROM log_chunks GROUP BY job_id, attempt"
    )


def downgrade() -> None:
    op.drop_table("attempt_logs")
