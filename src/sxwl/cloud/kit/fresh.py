"""A map whose entries are kept for a fixed time and are grouped by an owner, so that everything of
one owner can be dropped at once: what a process may remember of the database for a moment."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Fresh(Generic[K, V]):
    """Entries younger than ``fresh_s``, at most ``size`` of them (the oldest go first when full).
    Read and written from request threads and the event loop alike."""

    def __init__(self, fresh_s: float, size: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.fresh_s, self.size, self._clock = fresh_s, size, clock
        self._entries: dict[K, tuple[float, str, V]] = {}  # in the order they were put
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if self._clock() - entry[0] >= self.fresh_s:
                del self._entries[key]
                return None
            return entry[2]

    def put(self, key: K, owner: str, value: V) -> None:
        if self.fresh_s <= 0:
            return
        with self._lock:
            self._entries.pop(key, None)
            while len(self._entries) >= self.size:
                del self._entries[next(iter(self._entries))]
            self._entries[key] = (self._clock(), owner, value)

    def forget_owner(self, owner: str) -> None:
        with self._lock:
            for key in [k for k, (_, o, _) in self._entries.items() if o == owner]:
                del self._entries[key]

    def __len__(self) -> int:
        return len(self._entries)
