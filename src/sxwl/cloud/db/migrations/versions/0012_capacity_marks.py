"""CPods carry a capacity mark: which write last changed what the scheduler reads of them.

A scheduling pass used to compare every online CPod's heartbeat version with its cache (at 10,000
CPods, 165 ms of a pass here, most of it decoding rows). Now triggers mark each row a write touches in
the columns the scheduler reads, and a pass reads only the rows marked since its last one
(services/capacity_marks.py says how each engine orders the marks). Triggers, not the writers,
because every writer of those columns (heartbeats, liveness, revocation, an agent's start, SQL typed
by an operator) must be seen and none of them needs to know.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

# What services/capacity.py reads of a CPod; a write to any of them marks the row.
WATCHED = (
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


def upgrade() -> None:
    with op.batch_alter_table("cpods") as batch:
        batch.add_column(sa.Column("capacity_mark", sa.BigInteger(), nullable=False, server_default="0"))
    op.create_index("ix_cpods_capacity_mark", "cpods", ["capacity_mark"])
    columns = ", ".join(WATCHED)
    if op.get_bind().dialect.name == "postgresql":
        # The writer's transaction id: a pass reads from the oldest transaction still running when
        # it starts, so a write that commits after a pass is read by the next one.
        op.execute(
            """
            CREATE FUNCTION sxwl_mark_cpod_capacity() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                NEW.capacity_mark := pg_current_xact_id()::text::bigint;
                RETURN NEW;
            END $$
            """
        )
        op.execute(
            f"CREATE TRIGGER cpods_capacity_mark BEFORE INSERT OR UPDATE OF {columns} ON cpods "
            "FOR EACH ROW EXECUTE FUNCTION sxwl_mark_cpod_capacity()"
        )
        return
    # SQLite has one writer at a time, so one past the highest mark orders marks as commits are.
    # (Its triggers do not fire themselves again: recursive_triggers is off.)
    mark = "UPDATE cpods SET capacity_mark = (SELECT MAX(capacity_mark) + 1 FROM cpods) WHERE id = NEW.id"
    op.execute(f"CREATE TRIGGER cpods_capacity_mark_insert AFTER INSERT ON cpods BEGIN {mark}; END")
    op.execute(
        f"CREATE TRIGGER cpods_capacity_mark_update AFTER UPDATE OF {columns} ON cpods BEGIN {mark}; END"
    )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER cpods_capacity_mark ON cpods")
        op.execute("DROP FUNCTION sxwl_mark_cpod_capacity()")
    else:
        op.execute("DROP TRIGGER cpods_capacity_mark_insert")
        op.execute("DROP TRIGGER cpods_capacity_mark_update")
    op.drop_index("ix_cpods_capacity_mark", "cpods")
    op.drop_column("cpods", "capacity_mark")
