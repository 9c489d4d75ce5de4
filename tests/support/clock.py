"""A frozen clock for in-process tests: services read ``sxwl.cloud.db.types.CLOCK``; a test moves it
by exact amounts instead of sleeping."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sxwl.cloud.db.types import CLOCK

# Mid-month, so that a test advancing hours or days stays in one statement month.
START = datetime(2026, 3, 10, 9, 0, tzinfo=UTC)


class TestClock:
    __test__ = False  # not a test class, whatever its name

    def __init__(self, start: datetime = START) -> None:
        CLOCK.frozen = start

    @property
    def now(self) -> datetime:
        assert CLOCK.frozen is not None
        return CLOCK.frozen

    def advance(self, seconds: float) -> datetime:
        CLOCK.frozen = self.now + timedelta(seconds=seconds)
        return CLOCK.frozen

    @staticmethod
    def release() -> None:
        CLOCK.frozen = None
