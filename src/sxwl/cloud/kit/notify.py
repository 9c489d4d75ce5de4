"""Wake-ups: the scheduler after a submit or a freed GPU, the long-polls of a CPod after an
assignment or a command, and followers of a job after its state or log changed.

Services never wake anyone themselves: they note on their unit of work what it changed
(``on_commit(session).wake_scheduler()``), and the notifier sends those wake-ups once that
transaction has committed, and never when it rolls back. A waiter woken earlier could read before
the commit, find nothing, and sleep until its next re-read.

Within one process the wake-ups are handed to the event loop thread-safely (services run in worker
threads). On PostgreSQL the same wake-ups travel to every other replica: the unit of work issues
``pg_notify`` on ``CHANNEL`` as its last statement before COMMIT, and PostgreSQL delivers
notifications only when, and only if, that transaction commits, so they are as atomic as the local
ones. Each replica listens on one dedicated connection (background/listener.py) and turns what it
receives into local wake-ups; its own notifications, already delivered in-process, are skipped.
On SQLite the one server hears other processes' writes by asking SQLite, once a second, whether
the file changed (background/sqlite_watch.py). How they travel, the backstop re-read and what a
dropped listener does: docs/replicas.md."""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import event as orm_event
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

CHANNEL = "sxwl_wakeups"
_PENDING = "sxwl.wakeups"
_ANNOUNCED = "sxwl.announced"
# Until this process hears other processes' writes (the listener connected on PostgreSQL, the
# watch started on SQLite), they are only seen by re-reading: as often as the long-poll always did.
UNHEARD_REREAD_S = 1.0


@dataclass
class Wakeups:
    """What one unit of work wakes when it commits."""

    scheduler: bool = False
    cpods: set[str] = field(default_factory=set)
    jobs: set[str] = field(default_factory=set)
    users: set[str] = field(default_factory=set)

    def wake_scheduler(self) -> None:
        self.scheduler = True

    def wake_cpod(self, cpod_id: str) -> None:
        self.cpods.add(cpod_id)

    def wake_job(self, job_id: str) -> None:
        self.jobs.add(job_id)

    def user_changed(self, user_id: str) -> None:
        """The user's credentials or endpoints changed: what any process remembers of them for a
        moment (services/endpoints/call_cache.py) is dropped."""
        self.users.add(user_id)

    def targets(self) -> list[str]:
        """What the notifications name: ``scheduler``, ``cpod:<id>``, ``job:<id>``, ``user:<id>``."""
        return (["scheduler"] if self.scheduler else []) + [
            *(f"cpod:{c}" for c in sorted(self.cpods)),
            *(f"job:{j}" for j in sorted(self.jobs)),
            *(f"user:{u}" for u in sorted(self.users)),
        ]


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
        # Names this process in its notifications, so that it skips its own.
        self.origin = secrets.token_hex(8)
        self._hearing = False
        # CPods whose last read on this replica found nothing, and when (loop time): while nothing
        # has woken a CPod since and the listener has not dropped, its next long-poll need not read.
        self._quiet: dict[str, float] = {}
        self._broadcast = False
        self._count_lock = threading.Lock()
        # Called with a user's id once a change to that user's credentials or endpoints committed,
        # here (in the committing thread, before its request answers) or on another replica.
        self.user_listeners: list[Callable[[str], None]] = []
        self.notifications_sent = 0
        self.notifications_received = 0

    @property
    def hearing(self) -> bool:
        """True while other processes' changes reach this one (PostgreSQL: the listening connection
        is up; SQLite: the watch runs): then waiters re-read only as a backstop."""
        return self._hearing

    @hearing.setter
    def hearing(self, hearing: bool) -> None:
        # Whatever was quiet before a drop may have changed unheard; after a reconnect, too.
        self._quiet.clear()
        self._hearing = hearing

    def note_quiet(self, cpod_id: str, at: float) -> None:
        """Records that a read for ``cpod_id`` found nothing at loop time ``at``; the caller checks,
        with no await in between, that nothing woke the CPod during that read."""
        if self._hearing:
            self._quiet[cpod_id] = at

    def quiet_since(self, cpod_id: str) -> float | None:
        """When this replica last found nothing for ``cpod_id``, if nothing can have changed since."""
        return self._quiet.get(cpod_id) if self._hearing else None

    def shutdown(self) -> None:
        """Called on the event loop's thread when the server is asked to exit."""
        self.stopping = True
        self.rouse()

    def rouse(self) -> None:
        """Wakes the scheduler and every waiter (on the event loop's thread): after shutdown, or when
        notifications may have been missed."""
        self._quiet.clear()
        self.scheduler.set()
        for waiters in self._waiters.values():
            for event in waiters:
                event.set()

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def watch(self, *makers: sessionmaker[Session], broadcast: bool = False) -> None:
        """Sends what units of work of these session makers noted with ``on_commit`` after each
        commit; ``broadcast`` (PostgreSQL): to other replicas too, with NOTIFY."""
        self._broadcast = broadcast
        for sessions in makers:
            if broadcast:
                orm_event.listen(sessions, "before_commit", self._announce)
            orm_event.listen(sessions, "after_commit", self._committed)
            orm_event.listen(sessions, "after_rollback", _discard)

    def reread_s(self, backstop_s: float) -> float:
        """How long a waiter may sleep before it re-reads on its own."""
        return backstop_s if self.hearing else min(backstop_s, UNHEARD_REREAD_S)

    def _announce(self, session: Session) -> None:
        pending = session.info.get(_PENDING)
        if not isinstance(pending, Wakeups):
            return
        payloads = [f"{self.origin} {target}" for target in pending.targets()]
        if payloads:
            # One round trip however many CPods a scheduling pass placed on.
            session.execute(
                text("SELECT pg_notify(:channel, p) FROM unnest(CAST(:payloads AS text[])) AS p"),
                {"channel": CHANNEL, "payloads": payloads},
            )
            session.info[_ANNOUNCED] = len(payloads)

    def _committed(self, session: Session) -> None:
        sent = session.info.pop(_ANNOUNCED, 0)
        if sent:
            with self._count_lock:
                self.notifications_sent += sent
        pending = session.info.pop(_PENDING, None)
        if not isinstance(pending, Wakeups):
            return
        if pending.scheduler:
            self.wake_scheduler()
        for cpod_id in pending.cpods:
            self.wake_cpod(cpod_id)
        for job_id in pending.jobs:
            self.wake_job(job_id)
        for user_id in pending.users:
            self._user_changed(user_id)

    def _user_changed(self, user_id: str) -> None:
        for listener in self.user_listeners:
            listener(user_id)

    def heard(self, payload: str) -> None:
        """A notification from the listening connection (on the event loop's thread)."""
        origin, _, target = payload.partition(" ")
        if origin == self.origin:
            return
        self.notifications_received += 1
        if target == "scheduler":
            self.scheduler.set()
        elif target.startswith(("cpod:", "job:")):
            self._set_waiters(target)
        elif target.startswith("user:"):
            self._user_changed(target[5:])

    def file_changed(self, cpods: set[str]) -> None:
        """A commit to the SQLite file, maybe by another process (on the event loop's thread): the
        scheduler runs a pass, the long-polls of ``cpods`` (those with something to be told now)
        read, and so does every job follower (they are few)."""
        self.scheduler.set()
        for cpod_id in cpods:
            self._set_waiters(f"cpod:{cpod_id}")
        for key, waiters in self._waiters.items():
            if key.startswith("job:"):
                for event in waiters:
                    event.set()

    def _soon(self, callback: object, *args: object) -> None:
        if self._loop is None or self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(callback, *args)  # type: ignore[arg-type]

    def wake_scheduler(self) -> None:
        self._soon(self.scheduler.set)

    def wake_cpod(self, cpod_id: str) -> None:
        self._soon(self._set_waiters, f"cpod:{cpod_id}")

    def wake_job(self, job_id: str) -> None:
        self._soon(self._set_waiters, f"job:{job_id}")

    def _set_waiters(self, key: str) -> None:
        if key.startswith("cpod:"):
            self._quiet.pop(key[5:], None)
        for event in self._waiters.get(key, ()):
            event.set()

    def waiter(self, cpod_id: str) -> asyncio.Event:
        """An event set when this CPod gets work; release it with ``forget``."""
        return self._add(f"cpod:{cpod_id}")

    def forget(self, cpod_id: str, event: asyncio.Event) -> None:
        self._remove(f"cpod:{cpod_id}", event)

    def held_polls(self, cpod_id: str | None = None) -> int:
        """The long-polls waiting on this replica now: of one CPod, or of all."""
        if cpod_id is not None:
            return len(self._waiters.get(f"cpod:{cpod_id}", ()))
        return sum(len(waiters) for key, waiters in self._waiters.items() if key.startswith("cpod:"))

    def job_waiter(self, job_id: str) -> asyncio.Event:
        """An event set when this job's state or log changes; release it with ``forget_job``."""
        return self._add(f"job:{job_id}")

    def forget_job(self, job_id: str, event: asyncio.Event) -> None:
        self._remove(f"job:{job_id}", event)

    def _add(self, key: str) -> asyncio.Event:
        event = asyncio.Event()
        self._waiters[key].add(event)
        return event

    def _remove(self, key: str, event: asyncio.Event) -> None:
        waiters = self._waiters.get(key)
        if waiters is not None:
            waiters.discard(event)
            if not waiters:
                del self._waiters[key]


def _discard(session: Session) -> None:
    session.info.pop(_PENDING, None)
    session.info.pop(_ANNOUNCED, None)
