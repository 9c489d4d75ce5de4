"""Lone reads outside a transaction (Database.scalar), which a CPod's long-poll renewal uses for its
token check: the same answers as the ORM check, on SQLite and PostgreSQL, and a read that survives
PostgreSQL dropping the connection it would have used."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import func, insert, literal, select, update

from sxwl.cloud.api.agent.routes import _authenticated
from sxwl.cloud.context import CloudContext
from sxwl.cloud.db import migrate
from sxwl.cloud.db.engine import Database
from sxwl.cloud.db.models import CPod, CPodStatus, Role, User
from sxwl.cloud.errors import AppError
from sxwl.cloud.kit.security import token_hash
from sxwl.cloud.services.fleet.cpod_tokens import PREFIX as CPOD_TOKEN_PREFIX
from tests.conftest import MakeSettings
from tests.support.postgres import TempPostgres

OWNER = "p" * 32
CPOD = "c" * 32
TOKEN = CPOD_TOKEN_PREFIX + "lone-read-token"


@pytest.fixture
def ctx(make_settings: MakeSettings) -> Iterator[CloudContext]:
    context = CloudContext.from_settings(make_settings())
    migrate.upgrade(context.db.engine)
    with context.db.session() as session:
        session.execute(
            insert(User).values(id=OWNER, email="p@example.com", password_hash="x", role=Role.PROVIDER)
        )
        session.execute(
            insert(CPod).values(
                id=CPOD,
                owner_id=OWNER,
                name="lone",
                cluster_uid="lone",
                runtime="local",
                agent_version="t",
                status=CPodStatus.ONLINE,
                token_hash=token_hash(TOKEN),
                heartbeat_interval_s=10,
                nodes=[],
                reported_jobs=[],
            )
        )
    yield context
    context.db.dispose()


def refused(ctx: CloudContext, token: str | None) -> tuple[int, str]:
    with pytest.raises(AppError) as caught:
        _authenticated(ctx, token)
    return caught.value.status, caught.value.code


def test_a_renewal_token_check_answers_as_the_full_check_does(ctx: CloudContext) -> None:
    assert _authenticated(ctx, TOKEN) == CPOD
    assert refused(ctx, None)[0] == 401
    assert refused(ctx, "not-a-cpod-token") == (401, "cpod_revoked")
    assert refused(ctx, TOKEN + "x") == (401, "cpod_revoked")
    with ctx.db.session() as session:
        session.execute(update(CPod).where(CPod.id == CPOD).values(revoked_at=func.now()))
    assert refused(ctx, TOKEN) == (401, "cpod_revoked")


def test_a_lone_read_survives_a_connection_the_server_dropped(postgres: TempPostgres) -> None:
    url = postgres.create_database()
    database_name = url.rsplit("/", 1)[1]
    db = Database(url)
    try:
        assert db.scalar(select(literal(1))) == 1  # a pooled connection now waits for the next read
        with psycopg.connect(postgres.url(), autocommit=True) as conn:
            killed = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (database_name,),
            ).fetchall()
        assert killed and all(row == (True,) for row in killed)
        assert db.scalar(select(literal(2))) == 2
        # And outside a transaction: what it reads is committed by no one but the statement itself.
        assert db.scalar(select(func.pg_current_xact_id_if_assigned())) is None
    finally:
        db.dispose()
