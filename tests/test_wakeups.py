"""Wake-ups are sent after the unit of work that caused them commits, never before and never after a
rollback; routes do not wake anyone themselves (SQLite and PostgreSQL)."""

from __future__ import annotations

import threading

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from sxwl.cloud.app import create_app
from sxwl.cloud.context import CloudContext
from sxwl.cloud.db import migrate
from sxwl.cloud.db.engine import Database
from sxwl.cloud.db.models import Role, User
from sxwl.cloud.kit.notify import Notifier, on_commit
from tests.conftest import MakeSettings
from tests.test_jobs_api import Setup


class RecordingNotifier(Notifier):
    """A real notifier that also notes, at each wake-up, whether the change is visible to another
    connection, i.e. whether its transaction had committed."""

    def __init__(self, db: Database, email: str) -> None:
        super().__init__()
        self.db, self.email = db, email
        self.woken: list[tuple[str, bool]] = []

    def _visible(self) -> bool:
        with self.db.session() as other:
            return other.scalar(select(User.id).where(User.email == self.email)) is not None

    def wake_scheduler(self) -> None:
        self.woken.append(("scheduler", self._visible()))
        super().wake_scheduler()

    def wake_cpod(self, cpod_id: str) -> None:
        self.woken.append((cpod_id, self._visible()))
        super().wake_cpod(cpod_id)


@pytest.fixture
def database(db_url: str) -> Database:
    db = Database(db_url)
    migrate.upgrade(db.engine)
    return db


def add_user(email: str) -> User:
    return User(email=email, password_hash="x", role=Role.USER)


def test_wakeups_fire_once_after_the_commit(database: Database) -> None:
    notifier = RecordingNotifier(database, "a@example.com")
    notifier.watch(database.sessions)
    with database.session() as session:
        session.add(add_user("a@example.com"))
        on_commit(session).wake_scheduler()
        on_commit(session).wake_cpod("cpod-1")
        on_commit(session).wake_cpod("cpod-1")
        session.flush()
        assert notifier.woken == []
    assert sorted(notifier.woken) == [("cpod-1", True), ("scheduler", True)]


def test_a_rolled_back_unit_of_work_wakes_nobody(database: Database) -> None:
    notifier = RecordingNotifier(database, "b@example.com")
    notifier.watch(database.sessions)
    with pytest.raises(RuntimeError), database.session() as session:
        session.add(add_user("b@example.com"))
        on_commit(session).wake_scheduler()
        session.flush()
        raise RuntimeError("the request failed")
    with database.session() as session:
        session.add(add_user("c@example.com"))
    assert notifier.woken == []


def test_a_users_change_reaches_the_listeners_once_committed_and_never_on_a_rollback(
    database: Database,
) -> None:
    notifier = RecordingNotifier(database, "u@example.com")
    notifier.watch(database.sessions)
    heard: list[tuple[str, bool]] = []
    notifier.user_listeners.append(lambda user_id: heard.append((user_id, notifier._visible())))
    with pytest.raises(RuntimeError), database.session() as session:
        session.add(add_user("u@example.com"))
        on_commit(session).user_changed("u1")
        session.flush()
        raise RuntimeError("the request failed")
    assert heard == []
    with database.session() as session:
        session.add(add_user("u@example.com"))
        on_commit(session).user_changed("u1")
        session.flush()
        assert heard == []
    assert heard == [("u1", True)]  # in the committing thread, before its request answers
    notifier.heard("another-replica user:u2")
    assert heard[-1] == ("u2", True)


def test_rest_cancel_wakes_the_cpod_and_a_freed_queue_place_the_scheduler(
    make_settings: MakeSettings,
) -> None:
    with TestClient(create_app(make_settings())) as client:
        setup = Setup(client)
        ctx: CloudContext = client.app.state.ctx  # type: ignore[attr-defined]
        woken: list[str] = []
        wake_cpod, wake_scheduler = ctx.notifier.wake_cpod, ctx.notifier.wake_scheduler

        def recorded_cpod(cpod_id: str) -> None:
            woken.append(cpod_id)
            wake_cpod(cpod_id)

        def recorded_scheduler() -> None:
            woken.append("scheduler")
            wake_scheduler()

        ctx.notifier.wake_cpod = recorded_cpod  # type: ignore[method-assign]
        ctx.notifier.wake_scheduler = recorded_scheduler  # type: ignore[method-assign]

        running = setup.submit()
        setup.assigned(running["id"])
        woken.clear()
        reply = client.post(f"/api/v1/jobs/{running['id']}/cancel", headers=setup.user)
        assert reply.status_code == 200, reply.text
        assert woken == [setup.cpod_id]  # its stop command is waiting for the CPod's long-poll

        queued = setup.submit(gpus_per_node=64)  # more than the CPod has: stays queued
        woken.clear()
        assert client.post(f"/api/v1/jobs/{queued['id']}/cancel", headers=setup.user).status_code == 200
        assert woken == ["scheduler"]


def test_a_log_follower_waits_for_the_jobs_next_output(make_settings: MakeSettings) -> None:
    with TestClient(create_app(make_settings())) as client:
        setup = Setup(client)
        job_id = setup.submit()["id"]
        setup.assigned(job_id)
        assert setup.status(job_id, 1, "running").status_code == 200
        logs = f"/api/v1/jobs/{job_id}/logs"
        bad = client.get(logs, params={"wait": -1}, headers=setup.user)
        assert bad.status_code == 422 and "wait" in bad.text
        answers: list[httpx.Response] = []
        follower = threading.Thread(
            target=lambda: answers.append(client.get(logs, params={"wait": 30}, headers=setup.user))
        )
        follower.start()
        follower.join(0.5)
        assert answers == []  # nothing to show yet: it waits
        assert setup.log(job_id, 1, 0, b"step 1\n").status_code == 200
        follower.join(20)
        (answer,) = answers
        assert answer.text == "step 1\n" and answer.headers["X-Next-Offset"] == "7"
