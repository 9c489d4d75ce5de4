"""The agent's long-poll held past its keep-alive, and renewals that need no read (SQLite and
PostgreSQL: a process that hears other processes' writes, through the listener or the SQLite file's
watch, knows that a quiet CPod's renewal has nothing new to read)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Connection, event

from tests.support.agent import eventually
from tests.test_cpods_api import ctx_of
from tests.test_jobs_api import Setup

KEEPALIVE_S = 0.2


@pytest.fixture
def setup(make_client: Callable[..., TestClient]) -> Setup:
    return Setup(make_client(longpoll_keepalive_s=KEEPALIVE_S))


@pytest.fixture
def dispatch_reads(setup: Setup) -> Iterator[list[str]]:
    """The statements that read a CPod's pending commands: one per read of what it is to be told
    (not the SQLite watch's one read for all CPods, which names no CPod)."""
    engine = ctx_of(setup.client).db.engine
    seen: list[str] = []

    def record(_conn: Connection, _cursor: object, statement: str, *_: object) -> None:
        if "FROM agent_commands" in statement and "agent_commands.cpod_id = " in statement:
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    yield seen
    event.remove(engine, "before_cursor_execute", record)


def _poll(setup: Setup, wait: float) -> Any:
    return setup.client.get(f"/api/v1/agent/assignments?wait={wait}", headers=setup.agent)


def test_a_hold_past_the_keepalive_is_kept_open_by_newlines_and_stays_one_document(setup: Setup) -> None:
    response = _poll(setup, wait=1.5)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    assert response.content.startswith(b"\n\n\n")  # about one per KEEPALIVE_S
    assert response.json() == {"assignments": [], "commands": []}


def test_work_that_comes_during_a_streamed_hold_ends_it_at_once(setup: Setup) -> None:
    answer: list[Any] = []
    poller = threading.Thread(target=lambda: answer.append(_poll(setup, wait=20)))
    poller.start()
    time.sleep(KEEPALIVE_S * 4)  # streaming: its first keep-alives have gone out
    job = setup.submit()
    poller.join(15)
    assert answer, "the long-poll did not answer"
    reply = json.loads(answer[0].content)
    assert answer[0].content.startswith(b"\n")
    assert [a["job_id"] for a in reply["assignments"]] == [job["id"]]
    assert reply["assignments"][0]["upload_token"]


def test_a_held_poll_reads_once_while_nothing_changes(setup: Setup, dispatch_reads: list[str]) -> None:
    notifier = ctx_of(setup.client).notifier
    eventually(lambda: notifier.hearing, what="this process hears other processes' writes")
    # Held past the seconds at which a poll that hears nothing re-reads (notify.UNHEARD_REREAD_S).
    assert _poll(setup, wait=3).json() == {"assignments": [], "commands": []}
    assert len(dispatch_reads) == 1


def test_a_quiet_cpods_renewal_reads_only_after_something_changed(
    setup: Setup, dispatch_reads: list[str]
) -> None:
    notifier = ctx_of(setup.client).notifier
    eventually(lambda: notifier.hearing, what="this process hears other processes' writes")
    assert _poll(setup, wait=0).json() == {"assignments": [], "commands": []}
    assert len(dispatch_reads) == 1
    assert _poll(setup, wait=0).json() == {"assignments": [], "commands": []}
    # Hearing every change (the listener on PostgreSQL, the file's watch on SQLite), the process
    # knows that nothing changed.
    assert len(dispatch_reads) == 1

    job = setup.submit()
    setup.assigned(job["id"])  # committed between two polls: no poll was waiting to be woken
    before = len(dispatch_reads)
    reply = _poll(setup, wait=0).json()
    assert [a["job_id"] for a in reply["assignments"]] == [job["id"]]
    assert len(dispatch_reads) == before + 1
    # Still pending until the agent reports it starting: delivered again, read again.
    assert [a["job_id"] for a in _poll(setup, wait=0).json()["assignments"]] == [job["id"]]
    assert len(dispatch_reads) == before + 2


def test_a_process_that_stops_hearing_forgets_what_was_quiet(setup: Setup, dispatch_reads: list[str]) -> None:
    notifier = ctx_of(setup.client).notifier
    eventually(lambda: notifier.hearing, what="this process hears other processes' writes")
    _poll(setup, wait=0)
    assert notifier.quiet_since(setup.cpod_id) is not None
    notifier.hearing = False  # what the listener (the SQLite watch) sets when it drops (fails)
    assert notifier.quiet_since(setup.cpod_id) is None
    notifier.hearing = True  # and reconnected: what changed unheard meanwhile must be read
    _poll(setup, wait=0)
    assert len(dispatch_reads) == 2


@pytest.mark.parametrize("wait", ["-1", "abc", "nan", "inf", "1e999", "\x00"])
def test_a_bad_wait_is_a_422_naming_it(setup: Setup, wait: str) -> None:
    response = setup.client.get("/api/v1/agent/assignments", params={"wait": wait}, headers=setup.agent)
    assert response.status_code == 422, response.text
    assert [d["field"] for d in response.json()["error"]["details"]] == ["wait"]


def test_the_long_poll_still_refuses_a_missing_token_and_a_users_token(setup: Setup) -> None:
    assert setup.client.get("/api/v1/agent/assignments").status_code == 401
    assert setup.client.get("/api/v1/agent/assignments", headers=setup.user).status_code == 403
