"""Sliding-window rate limits for login and registration, counted in the database so that every
replica (and every worker process) shares them (docs/replica-state.md)."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, LargeBinary, delete, func, insert, literal, select
from sqlalchemy.orm import Session

from sxwl.cloud.config import parse_rate
from sxwl.cloud.db import locks
from sxwl.cloud.db.engine import Database
from sxwl.cloud.db.shared_state import RateEvent
from sxwl.cloud.db.types import UTCDateTime, utcnow
from sxwl.cloud.errors import AppError
from sxwl.cloud.kit.security import SecretBox

_KEY_PURPOSE = b"sxwl rate limit key v1"


class RateLimiter:
    """Counts events per key within a sliding window. Two replicas never both let the event past the
    limit through: a counted event is inserted only if its window has room, under a lock on the key
    (a transaction-scoped advisory lock on PostgreSQL, the write lock on SQLite)."""

    def __init__(self, name: str, rate: str, what: str, db: Database, box: SecretBox) -> None:
        self.limit, self.window = parse_rate(rate)
        self.name = name
        self.what = what
        self._db = db
        self._box = box
        self._span = timedelta(seconds=self.window)
        self._postgres = db.engine.dialect.name == "postgresql"

    def hit(self, key: str) -> int:
        """Records one event for ``key`` and returns its id; raises 429 when the window is already full."""
        taken = self.take(key)
        if isinstance(taken, AppError):
            raise taken
        return taken

    def take(self, key: str) -> int | AppError:
        """Records one event for ``key`` and returns its id, or, when the window is already full,
        records nothing and returns the 429 to answer."""
        digest = self._digest(key)
        with self._db.session(immediate=True) as session:
            if self._postgres:
                lock = int.from_bytes(digest[:4], "big", signed=True)
                session.execute(select(func.pg_advisory_xact_lock(locks.RATE_CLASS, lock)))
            now = utcnow()
            room = select(func.count()).where(_live(digest, now)).scalar_subquery() < self.limit
            event = select(literal(digest, LargeBinary), literal(now + self._span, UTCDateTime())).where(room)
            taken: int | None = session.scalar(
                insert(RateEvent).from_select(["key", "expires_at"], event).returning(RateEvent.id)
            )
            if taken is not None:
                return taken
            # The key's lock is still held: the window is as full as the insert found it.
            return self._too_many(self._oldest(session, digest, now)[1], now)

    def refusal(self, key: str) -> AppError | None:
        """The 429 to answer while ``key``'s window is full, else None."""
        with self._db.session() as session:
            return self._refusal(session, self._digest(key), utcnow())

    def record(self, key: str) -> None:
        """Records one event for ``key`` whether or not its window has room."""
        with self._db.session() as session:
            session.execute(insert(RateEvent).values(key=self._digest(key), expires_at=utcnow() + self._span))

    def release(self, event: int) -> None:
        """Takes back one event that ``hit`` or ``take`` recorded."""
        with self._db.session() as session:
            session.execute(delete(RateEvent).where(RateEvent.id == event))

    def clear(self, key: str) -> None:
        with self._db.session() as session:
            session.execute(delete(RateEvent).where(RateEvent.key == self._digest(key)))

    def _digest(self, key: str) -> bytes:
        # Keys name people (an address, an email): only their keyed hash is stored. Lone surrogates
        # (valid in JSON) must hash too, not fail.
        return self._box.mac(_KEY_PURPOSE, f"{self.name}\0{key}".encode("utf-8", "surrogatepass"))

    def _refusal(self, session: Session, digest: bytes, now: datetime) -> AppError | None:
        count, oldest = self._oldest(session, digest, now)
        return self._too_many(oldest, now) if count >= self.limit else None

    @staticmethod
    def _oldest(session: Session, digest: bytes, now: datetime) -> tuple[int, datetime | None]:
        """How many events ``digest``'s window holds, and when the oldest of them leaves it."""
        count, oldest = session.execute(
            select(func.count(), func.min(RateEvent.expires_at)).where(_live(digest, now))
        ).one()
        return int(count), oldest

    def _too_many(self, oldest: datetime | None, now: datetime) -> AppError:
        wait = (oldest - now) if oldest is not None else self._span
        retry = max(1, int(wait.total_seconds()) + 1)
        return AppError(
            429,
            f"too many {self.what}; try again in {retry} s",
            details={"retry_after_s": retry},
            headers={"Retry-After": str(retry)},
        )


def _live(digest: bytes, now: datetime) -> ColumnElement[bool]:
    return (RateEvent.key == digest) & (RateEvent.expires_at > now)


def sweep(db: Database) -> int:
    """Deletes the events that have left every window; returns how many."""
    with db.session() as session:
        deleted = session.connection().execute(delete(RateEvent).where(RateEvent.expires_at <= utcnow()))
        return int(deleted.rowcount)
