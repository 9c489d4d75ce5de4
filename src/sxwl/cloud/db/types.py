"""Column types that behave the same on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DateTime, String
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from sxwl.protocol.reasons import Reason


class UTCDateTime(TypeDecorator[datetime]):
    """Stores UTC; always hands back timezone-aware datetimes (SQLite forgets the zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Clock:
    """The cloud's sense of now, read by every service through ``utcnow``. Production never sets it
    and reads the system clock; in-process tests freeze it and move it by exact amounts
    (tests/support/clock.py), so that usage and holds can be checked to the micro-yuan."""

    def __init__(self) -> None:
        self.frozen: datetime | None = None

    def now(self) -> datetime:
        return datetime.now(UTC) if self.frozen is None else self.frozen


CLOCK = Clock()


def utcnow() -> datetime:
    return CLOCK.now()


class EncodedJSON(str):
    """JSON text that is already encoded (by pydantic's encoder, say): JSON columns store it as it is
    instead of decoding and encoding it again."""


def encode_json(value: Any) -> str:
    """The engines' JSON serializer."""
    return value if isinstance(value, EncodedJSON) else json.dumps(value)


class ReasonText(TypeDecorator[Reason]):
    """A reason or an event as its code and parameters (protocol/reasons.py), kept as JSON in a text
    column of ``length`` characters; text written before the codes reads back as it was stored, and
    words given as a plain string (a bulk insert of rows) are stored as such words."""

    impl = String
    cache_ok = True

    def process_bind_param(self, value: Reason | str | None, dialect: Dialect) -> str | None:
        if value is None:
            return None
        if isinstance(value, str):
            value = Reason.text(value)
        impl = self.impl_instance
        length = impl.length if isinstance(impl, String) else None
        return value.stored if length is None else value.stored_within(length)

    def process_result_value(self, value: Any, dialect: Dialect) -> Reason | None:
        return Reason.read(value)
