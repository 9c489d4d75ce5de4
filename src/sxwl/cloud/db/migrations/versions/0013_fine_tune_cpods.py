"""CPods say whether they run fine-tunes: ``cpods.takes_fine_tunes``.

Only the local runtime fetched a fine-tune's inputs and ran the trainer until now; a Kubernetes CPod
does too once its agent has a trainer image (docs/agent.md, "Fine-tunes on Kubernetes"). The agent
says which in the report it sends at every start. Rows of agents from before keep what they could:
true for the local runtime. The scheduler reads the column, so it joins the columns whose writes
mark a CPod's capacity (migration 0012).

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
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
)
AFTER = (*BEFORE, "takes_fine_tunes")


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
    op.add_column(
        "cpods", sa.Column("takes_fine_tunes", sa.Boolean(), nullable=False, server_default=sa.false())
    )
    op.execute("UPDATE cpods SET takes_fine_tunes = (runtime = 'local')")
    _watch(AFTER)


def downgrade() -> None:
    _watch(BEFORE)  # first: neither engine drops a column a trigger names
    # Not in batch mode, which would rebuild the SQLite table without its triggers.
    op.drop_column("cpods", "takes_fine_tunes")
