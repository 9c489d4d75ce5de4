"""Sliding-window rate limits for login and registration."""

from __future__ import annotations

import threading
import time
from collections import deque

from sxwl.cloud.config import parse_rate
from sxwl.cloud.errors import AppError


class RateLimiter:
    """Counts events per key within a window. Kept per process: it slows guessing down; it is not a
    quota that must survive restarts, so it does not belong in the database."""

    def __init__(self, rate: str, what: str) -> None:
        self.limit, self.window = parse_rate(rate)
        self.what = what
        self._events: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def hit(self, key: str) -> None:
        """Records one event for ``key``; raises 429 when the window is already full."""
        now = time.monotonic()
        with self._lock:
            refusal = self._refusal(key, now)
            if refusal is None:
                self._record(key, now)
        if refusal is not None:
            raise refusal

    def check(self, key: str) -> None:
        """Raises 429 when ``key``'s window is full; records nothing."""
        refusal = self.refusal(key)
        if refusal is not None:
            raise refusal

    def refusal(self, key: str) -> AppError | None:
        """The 429 to answer while ``key``'s window is full, else None."""
        now = time.monotonic()
        with self._lock:
            return self._refusal(key, now)

    def record(self, key: str) -> None:
        now = time.monotonic()
        with self._lock:
            self._record(key, now)

    def clear(self, key: str) -> None:
        with self._lock:
            self._events.pop(key, None)

    def _refusal(self, key: str, now: float) -> AppError | None:
        events = self._events.get(key)
        while events and events[0] <= now - self.window:
            events.popleft()
        if not events or len(events) < self.limit:
            return None
        retry = max(1, int(events[0] + self.window - now) + 1)
        return AppError(
            429,
            f"too many {self.what}; try again in {retry} s",
            details={"retry_after_s": retry},
            headers={"Retry-After": str(retry)},
        )

    def _record(self, key: str, now: float) -> None:
        self._events.setdefault(key, deque()).append(now)
        if len(self._events) > 100_000:
            self._drop_idle(now)

    def _drop_idle(self, now: float) -> None:
        for key in [k for k, v in self._events.items() if not v or v[-1] <= now - self.window]:
            del self._events[key]
