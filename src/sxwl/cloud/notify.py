"""Wake-ups inside one cloud process: the scheduler after a submit or a freed GPU, and the long-polls
of a CPod after an assignment or a command. Services run in worker threads, so every signal is
handed to the event loop thread-safely. Other replicas notice the same changes by re-reading the
database at least once a second.

Services never wake anyone themselves: they note on their unit of work what it changed
(``on_commit(session).wake_scheduler()``), and the notifier sends those wake-ups once that
transaction has committed, and never when it rolls back. A waiter woken earlier could read before
the commit, find nothing, and sleep until its next re-read."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy import event as orm_event
from sqlalchemy.orm import Session, sessionmaker

_PENDING = "sxwl.wakeups"


@dataclass
class Wakeups:
    """What one unit of work wakes when it commits."""

    scheduler: bool = False
    cpods: set[str] = field(default_factory=set)

    def wake_scheduler(self) -> None:
        self.scheduler = True

    def wake_cpod(self, cpod_id: str) -> None:
        self.cpods.add(cpod_id)


def on_commit(session: Session) -> Wakeups:
    """The wake-ups ``session``'s transaction sends once it has committed."""
    pending = session.info.get(_PENDING)
    if not isinstance(pending, Wakeups):
        pending = session.info[_PENDING] = Wakeups()
    return pending


class Notifier:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self.scheduler = asyncio.Event()
        self._waiters: dict[str, set[asyncio.Event]] = defaultdict(set)
        # Set when the process starts shutting down: long-polls answer at once and background loops
        # stop judging CPods, which cannot reach a server that no longer accepts requests.
        self.stopping = False
        # Wake-ups sent to and received from other replicas (for /metrics: cloud/metrics.py).
        self.notifications_sent = 0
        self.notifications_received = 0

    def shutdown(self) -> None:
        """Called on the event loop's thread when the server is asked to exit."""
        self.stopping = True
        self.scheduler.set()
        for waiters in self._waiters.values():
            for event in waiters:
                event.set()

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def watch(self, *makers: sessionmaker[Session]) -> None:
        """Sends what units of work of these session makers noted with ``on_commit`` after each
        commit."""
        for sessions in makers:
            orm_event.listen(sessions, "after_commit", self._committed)
            orm_event.listen(sessions, "after_rollback", _discard)

    def _committed(self, session: Session) -> None:
        pending = session.info.pop(_PENDING, None)
        if not isinstance(pending, Wakeups):
            return
        if pending.scheduler:
            self.wake_scheduler()
        for cpod_id in pending.cpods:
            self.wake_cpod(cpod_id)

    def _soon(self, callback: object, *args: object) -> None:
        if self._loop is None or self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(callback, *args)  # type: ignore[arg-type]

    def wake_scheduler(self) -> None:
        self._soon(self.scheduler.set)

    def wake_cpod(self, cpod_id: str) -> None:
        self._soon(self._set_waiters, cpod_id)

    def _set_waiters(self, cpod_id: str) -> None:
        for event in self._waiters.get(cpod_id, ()):
            event.set()

    def waiter(self, cpod_id: str) -> asyncio.Event:
        """An event set when this CPod gets work; release it with ``forget``."""
        event = asyncio.Event()
        self._waiters[cpod_id].add(event)
        return event

    def forget(self, cpod_id: str, event: asyncio.Event) -> None:
        waiters = self._waiters.get(cpod_id)
        if waiters is not None:
            waiters.discard(event)
            if not waiters:
                del self._waiters[cpod_id]


def _discard(session: Session) -> None:
    session.info.pop(_PENDING, None)
