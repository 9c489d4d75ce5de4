"""State shared by replicas (docs/replica-state.md): two apps on one database count the same sign-in
failures and registrations, and refuse to run with different secret keys, on both engines."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
from alembic import command
from fastapi.testclient import TestClient
from sqlalchemy import func, inspect, select

from sxwl.cloud.app import create_app
from sxwl.cloud.db import migrate
from sxwl.cloud.db.engine import Database
from sxwl.cloud.db.shared_state import RateEvent
from sxwl.cloud.errors import AppError
from sxwl.cloud.kit import ratelimit
from sxwl.cloud.kit.security import SecretBox
from sxwl.cloud.services.accounts import key_check
from tests.conftest import MakeSettings, login, register
from tests.support.clock import TestClock
from tests.test_cpods_api import ctx_of
from tests.test_login_policy import OWNER, attempt

Replicas = tuple[TestClient, TestClient]


def replicas(make_client: Callable[..., TestClient], **overrides: object) -> Replicas:
    """Two apps, each with its own engine and limiters, on one database and one secret key."""
    settings = {"rate_login_ip": "1000/60", "login_locked_delay_s": 0, **overrides}
    return make_client(**settings), make_client(**settings)


def retry_after(client: TestClient, password: str = "wrong password") -> int:
    response = client.post("/api/v1/auth/login", json={"email": OWNER, "password": password})
    assert response.status_code == 429, response.text
    assert response.json()["error"]["code"] == "too_many_requests"
    return int(response.headers["Retry-After"])


def events(client: TestClient) -> list[RateEvent]:
    with ctx_of(client).db.session() as session:
        return list(session.scalars(select(RateEvent)))


def test_failures_on_two_replicas_count_against_one_account(
    make_client: Callable[..., TestClient],
) -> None:
    one, two = replicas(make_client, rate_login_account="3/60")
    register(one, OWNER)
    assert [attempt(one, "wrong password") for _ in range(2)] == [401, 401]
    assert attempt(two, "wrong password") == 401
    assert retry_after(one) >= 1 and retry_after(two) >= 1
    # The right password still gets in on either replica and clears the account's failures there too.
    login(two, OWNER)
    assert attempt(one, "wrong password") == 401


def test_an_address_over_its_limit_on_one_replica_is_refused_on_the_other(
    make_client: Callable[..., TestClient],
) -> None:
    one, two = replicas(make_client, rate_login_ip="2/60", rate_login_account="100/60")
    register(one, OWNER)
    assert [attempt(one, "sprayed", "a@example.com"), attempt(two, "sprayed", "b@example.com")] == [401, 401]
    assert attempt(one, "correct horse") == 429 and attempt(two, "correct horse") == 429
    # Nothing stored names the address or the accounts: only keyed hashes of them.
    for event in events(one):
        assert len(event.key) == 32
        assert b"testclient" not in event.key and b"example.com" not in event.key


def test_registrations_share_the_limits_of_both_replicas(make_client: Callable[..., TestClient]) -> None:
    one, two = replicas(make_client, rate_register_ip="3/3600")
    register(one, "a@example.com")
    register(two, "b@example.com")
    register(one, "c@example.com")
    for client in (two, one):
        refused = client.post(
            "/api/v1/auth/register",
            json={"email": "d@example.com", "password": "correct horse", "role": "user"},
        )
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1


def test_parallel_failures_across_replicas_never_pass_it(
    make_client: Callable[..., TestClient],
) -> None:
    one, two = replicas(make_client, rate_login_account="5/60")
    register(one, OWNER)
    clients = [one, two] * 12
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda client: attempt(client, "wrong password"), clients))
    assert sorted(statuses) == [401] * 5 + [429] * 19


def test_parallel_events_on_two_limiters_are_counted_once_each(make_settings: MakeSettings) -> None:
    settings = make_settings()
    databases = [Database(settings.resolved_database_url()) for _ in range(2)]
    migrate.upgrade(databases[0].engine)
    box = SecretBox(settings.resolved_secret_key())
    limiters = [ratelimit.RateLimiter("t", "7/60", "tries", db, box) for db in databases]
    try:
        with ThreadPoolExecutor(8) as pool:
            taken = list(pool.map(lambda n: limiters[n % 2].take("k"), range(40)))
        assert len([t for t in taken if isinstance(t, int)]) == 7
        assert all(isinstance(t, AppError) and t.status == 429 for t in taken if not isinstance(t, int))
        # A released event frees its place for the next one, on either limiter.
        first = next(t for t in taken if isinstance(t, int))
        limiters[1].release(first)
        assert isinstance(limiters[0].take("k"), int)
        assert isinstance(limiters[1].take("k"), AppError)
    finally:
        for db in databases:
            db.dispose()


def test_the_window_slides_and_expired_events_are_swept(
    clock: TestClock, make_client: Callable[..., TestClient]
) -> None:
    # The address's limit: a refused attempt there records nothing, so the window is only the failures.
    one, two = replicas(make_client, rate_login_ip="2/60", rate_login_account="100/60")
    assert attempt(one, "wrong password") == 401
    clock.advance(30)
    assert attempt(two, "wrong password") == 401
    assert retry_after(one) == 31  # the first failure leaves the window 30 s from now
    clock.advance(30)
    assert attempt(two, "wrong password") == 401  # the first has left, the second is still in
    assert retry_after(one) == 31
    ctx = ctx_of(one)
    assert ratelimit.sweep(ctx.db) == 2  # the first failure's address and account events
    clock.advance(90)
    assert ratelimit.sweep(ctx.db) == 4
    assert events(one) == [] and ratelimit.sweep(ctx.db) == 0
    assert attempt(one, "wrong password") == 401


def test_odd_keys_get_4xx_not_5xx(make_client: Callable[..., TestClient]) -> None:
    one, _ = replicas(make_client)
    for email in ("\\ud800@example.com", "a\\u0000b", "x" * 320, " ", "\\udfff"):
        body = '{"email": "' + email + '", "password": "p"}'
        response = one.post("/api/v1/auth/login", content=body, headers={"Content-Type": "application/json"})
        assert 400 <= response.status_code < 500, (email, response.text)
    # A key the schema would refuse still hashes: the limiter itself never fails on its input.
    limiter = ctx_of(one).limiters.register_account
    assert isinstance(limiter.take("\ud800\x00"), int) and limiter.refusal("\ud800\x00") is None


def test_migration_0009_comes_and_goes(db_url: str) -> None:
    db = Database(db_url)
    try:
        migrate.upgrade(db.engine)
        config = migrate.alembic_config(db_url)
        with db.engine.begin() as connection:
            config.attributes["connection"] = connection
            command.downgrade(config, "0008")
        assert {"rate_events", "key_checks"}.isdisjoint(inspect(db.engine).get_table_names())
        migrate.upgrade(db.engine)
        with db.session() as session:
            assert session.scalar(select(func.count()).select_from(RateEvent)) == 0
    finally:
        db.dispose()


def test_a_replica_with_another_secret_key_refuses_to_start(make_settings: MakeSettings) -> None:
    create_app(make_settings()).state.ctx.db.dispose()
    again = create_app(make_settings())  # the same key: starts
    again.state.ctx.db.dispose()
    with pytest.raises(key_check.SecretKeyMismatchError, match="SXWL_SECRET_KEY differs"):
        create_app(make_settings(secret_key="another-secret-key-0123456789abcdef"))
