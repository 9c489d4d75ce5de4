"""Sign-in limits (docs/operations.md) and sign-out, on both engines."""

from __future__ import annotations

import time
from collections.abc import Callable

from fastapi.testclient import TestClient
from sqlalchemy import select

from sxwl.cloud.db.models import AuthSession, SessionKind
from sxwl.cloud.kit.security import token_hash
from tests.conftest import login, register
from tests.test_console_forms import csrf, register_form
from tests.test_cpods_api import ctx_of

OWNER = "owner@example.com"


def attempt(client: TestClient, password: str, email: str = OWNER) -> int:
    response = client.post("/api/v1/auth/login", json={"email": email, "password": password})
    status: int = response.status_code
    return status


def test_successful_logins_are_not_counted(make_client: Callable[..., TestClient]) -> None:
    client = make_client(rate_login_account="3/60", rate_login_ip="3/60")
    register(client, OWNER)
    for _ in range(8):
        login(client, OWNER)  # a script that signs in over and over is never throttled


def test_a_throttled_account_still_lets_the_right_password_in(make_client: Callable[..., TestClient]) -> None:
    client = make_client(rate_login_account="3/60", rate_login_ip="100/60", login_locked_delay_s=0.3)
    register(client, OWNER)
    assert [attempt(client, "wrong password") for _ in range(3)] == [401, 401, 401]
    wrong = client.post("/api/v1/auth/login", json={"email": "Owner@Example.com", "password": "guess 4"})
    assert wrong.status_code == 429 and int(wrong.headers["Retry-After"]) >= 1
    assert wrong.json()["error"]["code"] == "too_many_requests"

    started = time.monotonic()
    login(client, OWNER)  # the owner is not locked out, only slowed down
    assert time.monotonic() - started >= 0.3
    # The owner's sign-in clears the account's failures: the next mistake is an ordinary one.
    assert attempt(client, "wrong password") == 401

    # The console's form follows the same policy.
    for _ in range(3):
        attempt(client, "wrong password")
    token = csrf(client, "/login")
    form = {"csrf_token": token, "email": OWNER, "password": "still wrong"}
    assert client.post("/login", data=form).status_code == 429
    signed_in = client.post("/login", data=form | {"password": "correct horse"}, follow_redirects=False)
    assert signed_in.status_code == 303


def test_a_source_over_its_limit_is_refused_even_the_right_password(
    make_client: Callable[..., TestClient],
) -> None:
    client = make_client(rate_login_ip="3/60", rate_login_account="100/60")
    register(client, OWNER)
    assert [attempt(client, "sprayed password", f"u{i}@example.com") for i in range(3)] == [401] * 3
    assert attempt(client, "correct horse") == 429
    # The owner, from another address, is not affected by the spraying client.
    elsewhere = TestClient(client.app, client=("198.51.100.7", 40000))
    login(elsewhere, OWNER)


def session_row(client: TestClient, cookie: str) -> AuthSession:
    with ctx_of(client).db.session() as session:
        row = session.scalar(select(AuthSession).where(AuthSession.token_hash == token_hash(cookie)))
    assert row is not None and row.kind == SessionKind.CONSOLE
    return row


def test_logout_without_its_csrf_token_is_refused_and_changes_nothing(client: TestClient) -> None:
    register_form(client)
    cookie = client.cookies["sxwl_session"]
    for form in ({"csrf_token": "forged"}, {}):
        refused = client.post("/logout", data=form, follow_redirects=False)
        assert refused.status_code == 403
        assert "reload it and try again" in refused.text or "页面已过期" in refused.text
        assert not any(c.startswith("sxwl_session=") for c in refused.headers.get_list("set-cookie"))
    assert client.cookies["sxwl_session"] == cookie
    assert session_row(client, cookie).revoked_at is None
    assert client.get("/account", follow_redirects=False).status_code == 200


def test_logout_revokes_the_session_server_side(client: TestClient) -> None:
    register_form(client)
    cookie = client.cookies["sxwl_session"]
    out = client.post("/logout", data={"csrf_token": csrf(client, "/account")}, follow_redirects=False)
    assert out.status_code == 303 and out.headers["location"] == "/login?notice=logged_out"
    assert "sxwl_session" not in client.cookies
    assert session_row(client, cookie).revoked_at is not None
    # The old cookie, replayed from elsewhere, is no session any more.
    replay = TestClient(client.app, cookies={"sxwl_session": cookie})
    assert replay.get("/account", follow_redirects=False).headers["location"].startswith("/login")
