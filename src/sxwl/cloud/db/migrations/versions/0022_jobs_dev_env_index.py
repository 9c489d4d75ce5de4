"""An index of jobs by the dev environment they run (``jobs.dev_env_id``), over the rows that have
one: a scheduling pass that finds a resumed dev environment waiting for its full CPod reads that
environment's started attempts, to know whether its saved workspace is its latest (docs/dev-envs.md,
"Resumed elsewhere"), without reading every job.

Revision ID: 0022
Revises: 0021
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

_WHERE = sa.text("dev_env_id IS NOT NULL")


def upgrade() -> None:
    op.create_index("ix_jobs_dev_env", "jobs", ["dev_env_id"], sqlite_where=_WHERE, postgresql_where=_WHERE)


def downgrade() -> None:
    op.drop_index("ix_jobs_dev_env", table_name="jobs")
