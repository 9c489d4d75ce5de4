"""State that replicas share and that once lived in each process (docs/replica-state.md): the events
that rate limits count, and the check that every replica holds the same SXWL_SECRET_KEY."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Index, Integer, LargeBinary, String
from sqlalchemy.orm import Mapped, mapped_column

from sxwl.cloud.db.models import Base
from sxwl.cloud.db.types import UTCDateTime

# SQLite numbers rows itself only for a column declared exactly INTEGER PRIMARY KEY.
_ROW_ID = BigInteger().with_variant(Integer, "sqlite")


class RateEvent(Base):
    """One counted event (a failed sign-in, a registration) until it leaves its window. ``key`` is a
    keyed hash of the limiter and its key (an address, an email): nothing here names a person."""

    __tablename__ = "rate_events"
    id: Mapped[int] = mapped_column(_ROW_ID, primary_key=True, autoincrement=True)
    key: Mapped[bytes] = mapped_column(LargeBinary(32))
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (
        Index("ix_rate_events_key_expires_at", "key", "expires_at"),
        Index("ix_rate_events_expires_at", "expires_at"),
    )


class KeyCheck(Base):
    """A keyed hash of nothing under a key derived from SXWL_SECRET_KEY, written by the first replica
    that starts: one started with another key would fail every upload token, accessKey and rate-limit
    key the others made, so it refuses to start (services/accounts/key_check.py)."""

    __tablename__ = "key_checks"
    purpose: Mapped[str] = mapped_column(String(64), primary_key=True)
    digest: Mapped[bytes] = mapped_column(LargeBinary(32))
