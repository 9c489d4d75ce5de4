"""Which CPods a write changed since a scheduling pass last read them: the capacity marks that
migration 0012's triggers put on every row written in a column the scheduler reads.

A pass takes a watermark before it reads, reads the rows marked from the previous pass's
watermark on, and keeps the new one for the next pass. What a watermark is depends on how the
engine orders writes:

- PostgreSQL: a mark is the writer's transaction id, and the watermark the oldest transaction still
  running (the snapshot's xmin). A write that commits after the read has an id at or above it, so
  the next pass reads it; rows of transactions that were running are read again, which is harmless.
- SQLite: one writer at a time marks one past the highest mark, so marks follow commits, and the
  watermark is the highest mark the pass's snapshot holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import ColumnElement, Connection, func, select, text

from sxwl.cloud.db.models import CPod

_XMIN = text("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")


@dataclass(frozen=True)
class Watermark:
    mark: int
    inclusive: bool  # rows marked exactly `mark` are still to be read

    def unread(self) -> ColumnElement[bool]:
        """The rows written since the read this watermark was taken for."""
        if self.inclusive:
            return CPod.capacity_mark >= self.mark
        return CPod.capacity_mark > self.mark


def watermark(connection: Connection) -> Watermark:
    """Taken before the rows are read (PostgreSQL), or in the same snapshot (SQLite)."""
    if connection.dialect.name == "postgresql":
        return Watermark(int(connection.scalar(_XMIN) or 0), inclusive=True)
    return Watermark(int(connection.scalar(select(func.max(CPod.capacity_mark))) or 0), inclusive=False)
