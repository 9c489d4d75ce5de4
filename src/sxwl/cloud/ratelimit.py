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
            events = self._events.setdefault(key, deque())
            while events and events[0] <= now - self.window:
                events.popleft()
            if len(events) >= self.limit:
                retry = max(1, int(events[0] + self.window - now) + 1)
                raise AppError(
                    429,
                    f"too many {self.what}; try again in {retry} s",
                    details={"retry_after_s": retry},
                    headers={"Retry-After": str(retry)},
                )
            events.append(now)
            if len(self._events) > 100_000:
                self._drop_idle(now)

    def _drop_idle(self, now: float) -> None:
        for key in [k for k, v in self._events.items() if not v or v[-1] <= now - self.window]:
            del self._events[key]
