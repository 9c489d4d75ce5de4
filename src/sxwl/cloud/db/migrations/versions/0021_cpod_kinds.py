"""CPods say whether they run endpoint replicas and dev environments: ``cpods.takes_endpoints`` and
``cpods.takes_dev_envs``.

A local CPod always ran both; a Kubernetes one does once its agent has an engine image or a dev
environment image (docs/agent.md, "Endpoints on Kubernetes", "Dev environments on Kubernetes"). The
agent says which in the report it sends at every start, as it says whether it runs fine-tunes
(migration 0013). Rows of agents from before keep what they could: true for the local runtime. The
scheduler reads both, so they join the columns whose writes mark a CPod's capacity.

Revision ID: 0021
Revises: 0020
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

BEFORE = (
    "status",
    "revoked_at",
    "runtime",
    "isolation",
    "owner_id",
    "trusted_owner_ids",
    "nodes",
    "reported_jobs",
    "cached_inputs",
    "takes_fine_tunes",
)
ADDED = ("takes_endpoints", "takes_dev_envs")


def _watch(columns: tuple[str, ...]) -> None:
    """The update trigger of migration 0012, watching ``columns``."""
    watched = ", ".join(columns)
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER cpods_capacity_mark ON cpods")
        op.execute(
            f"CREATE TRIGGER cpods_capacity_mark BEFORE INSERT OR UPDATE OF {watched} ON cpods "
            "FOR EACH ROW EXECUTE FUNCTION sxwl_mark_cpod_capacity()"
        )
        return
    mark = "UPDATE cpods SET capacity_mark = (SELECT MAX(capacity_mark) + 1 FROM cpods) WHERE id = NEW.id"
    op.execute("DROP TRIGGER cpods_capacity_mark_update")
    op.execute(
        f"CREATE TRIGGER cpods_capacity_mark_update AFTER UPDATE OF {watched} ON cpods BEGIN {mark}; END"
    )


def upgrade() -> None:
    for column in ADDED:
        op.add_column("cpods", sa.Column(column, sa.Boolean(), nullable=False, server_default=sa.false()))
    op.execute("UPDATE cpods SET takes_endpoints = (runtime = 'local'), takes_dev_envs = (runtime = 'local')")
    _watch((*BEFORE, *ADDED))


def downgrade() -> None:
    _watch(BEFORE)  # first: neither engine drops a column a trigger names
    # Not in batch mode, which would rebuild the SQLite table without its triggers.
    for column in reversed(ADDED):
        op.drop_column("cpods", column)
