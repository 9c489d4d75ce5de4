"""`/readyz`, the cloud's readiness probe (docs/helm-cloud.md, "Probes"): ready only when the database
answers and its schema is at this code's Alembic head; `/healthz` stays the liveness probe."""

from __future__ import annotations

import socket
import threading

import pytest
from alembic.script import ScriptDirectory
from fastapi.testclient import TestClient
from sqlalchemy import Engine, create_engine, text

from sxwl.cloud.db import migrate
from sxwl.cloud.db.readiness import Readiness, Verdict
from tests.support.net import free_port


def head_and_previous() -> tuple[str, str]:
    script = ScriptDirectory.from_config(migrate.alembic_config(""))
    (head,) = script.get_heads()
    previous = script.get_revision(head).down_revision
    assert isinstance(previous, str)
    return head, previous


def set_revision(engine: Engine, revision: str) -> None:
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = :r"), {"r": revision})


def test_ready_when_the_database_answers_at_the_schema_head(client: TestClient) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ready", "database": "ok", "schema": "ok"}
    assert client.get("/healthz").json() == {"status": "ok"}


def test_a_schema_behind_the_head_is_not_ready_until_migrated_and_then_stays_ready(
    client: TestClient,
) -> None:
    engine = client.app.state.ctx.db.engine  # type: ignore[attr-defined]
    head, previous = head_and_previous()
    set_revision(engine, previous)
    response = client.get("/readyz")
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "not_ready"
    assert error["details"] == {"database": "ok", "schema": f"at {previous}, not at head {head}"}

    set_revision(engine, head)
    assert client.get("/readyz").status_code == 200
    # A newer replica migrating past this code's head during a rolling upgrade does not take this one
    # out of service: once at head, only the database's answer counts.
    set_revision(engine, previous)
    assert client.get("/readyz").status_code == 200


def test_a_database_that_does_not_answer_is_not_ready(caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    engine = create_engine(f"postgresql+psycopg://sxwl:hunter2@127.0.0.1:{port}/sxwl")
    try:
        verdict = Readiness(engine).check()
    finally:
        engine.dispose()
    assert (verdict.ready, verdict.database, verdict.schema) == (False, "unreachable", "unknown")
    assert "does not answer" in caplog.text and "hunter2" not in caplog.text


def test_checks_wait_for_a_silent_database_one_at_a_time() -> None:
    """A database host that accepts and never answers: a second probe gets its answer at once
    instead of a second thread waiting behind the first."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        engine = create_engine(f"postgresql+psycopg://sxwl@127.0.0.1:{port}/sxwl", pool_pre_ping=False)
        readiness = Readiness(engine)
        verdicts: list[Verdict] = []
        first = threading.Thread(target=lambda: verdicts.append(readiness.check()))
        first.start()
        peer, _ = silent.accept()  # the first check's connect, left without an answer
        second = readiness.check()
        assert (second.ready, second.database) == (False, "no answer yet to the previous check")
        peer.close()
    first.join(timeout=30)
    engine.dispose()
    assert [v.database for v in verdicts] == ["unreachable"]
