"""Registration, login, sessions and bad input, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import AccessKey, AuthSession, User
from tests.conftest import login, register


def counts(client: TestClient) -> tuple[int, int, int]:
    ctx: CloudContext = client.app.state.ctx  # type: ignore[attr-defined]
    with ctx.db.session() as session:
        return (
            session.scalar(select(func.count()).select_from(User)) or 0,
            session.scalar(select(func.count()).select_from(AuthSession)) or 0,
            session.scalar(select(func.count()).select_from(AccessKey)) or 0,
        )


def test_register_provider_and_user(client: TestClient) -> None:
    provider = register(
        client, "Owner@Example.COM", "provider", name="Li Lei", company="GPU Farm", phone="+86 138 0000 0000"
    )
    assert provider["email"] == "owner@example.com"
    assert provider["role"] == "provider"
    assert provider["company"] == "GPU Farm"
    assert "password" not in str(provider)
    user = register(client, "dev@example.com", "user")
    assert user["role"] == "user"
    assert counts(client) == (2, 0, 1)  # only the provider gets an accessKey


def test_password_is_stored_as_argon2id(client: TestClient) -> None:
    register(client, "a@example.com", password="s3cret-password")
    ctx: CloudContext = client.app.state.ctx  # type: ignore[attr-defined]
    with ctx.db.session() as session:
        stored = session.scalars(select(User.password_hash)).one()
    assert stored.startswith("$argon2id$")
    assert "s3cret-password" not in stored


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"email": "not-an-email", "password": "long enough", "role": "user"}, "email"),
        ({"email": "a@example.com", "password": "short", "role": "user"}, "password"),
        ({"email": "a@example.com", "password": "long enough", "role": "admin"}, "role"),
        ({"email": "a@example.com", "password": "long enough", "role": "wizard"}, "role"),
        ({"password": "long enough", "role": "user"}, "email"),
        ({"email": "a@example.com", "role": "user"}, "password"),
        ({"email": "a@example.com", "password": "long enough"}, "role"),
        ({"email": "a@example.com", "password": "long enough", "role": "user", "phone": "call me"}, "phone"),
        ({"email": "a@example.com", "password": "long enough", "role": "user", "is_admin": True}, "is_admin"),
    ],
)
def test_invalid_registration_is_422_naming_the_field(
    client: TestClient, body: dict[str, object], field: str
) -> None:
    response = client.post("/api/v1/auth/register", json=body)
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert field in [d["field"] for d in error["details"]]
    assert counts(client) == (0, 0, 0)


def test_duplicate_email_in_any_case_is_409(client: TestClient) -> None:
    register(client, "owner@example.com")
    before = counts(client)
    response = client.post(
        "/api/v1/auth/register",
        json={"email": "OWNER@example.com", "password": "another one", "role": "user"},
    )
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "email_taken"
    assert counts(client) == before


def test_login_gives_an_expiring_bearer_token(client: TestClient) -> None:
    register(client, "owner@example.com", name="Owner")
    response = client.post(
        "/api/v1/auth/login", json={"email": "  OWNER@example.com ", "password": "correct horse"}
    )
    assert response.status_code == 200
    body = response.json()
    assert body["token_type"] == "bearer"
    assert body["expires_in"] > 0
    assert body["access_token"].startswith("sxwl_")
    me = client.get("/api/v1/me", headers={"Authorization": f"Bearer {body['access_token']}"}).json()
    assert me["email"] == "owner@example.com"
    assert me["name"] == "Owner"


def test_expired_token_is_refused(make_client: Callable[..., TestClient]) -> None:
    client = make_client(api_token_ttl_s=-1)
    register(client, "owner@example.com")
    headers = login(client, "owner@example.com")
    assert client.get("/api/v1/me", headers=headers).status_code == 401


def test_wrong_password_and_unknown_email_look_the_same(client: TestClient) -> None:
    register(client, "owner@example.com")
    wrong = client.post(
        "/api/v1/auth/login", json={"email": "owner@example.com", "password": "wrong password"}
    )
    unknown = client.post(
        "/api/v1/auth/login", json={"email": "nobody@example.com", "password": "wrong password"}
    )
    malformed = client.post("/api/v1/auth/login", json={"email": "nobody", "password": "wrong password"})
    assert wrong.status_code == unknown.status_code == malformed.status_code == 401
    assert wrong.json() == unknown.json() == malformed.json()
    assert counts(client)[1] == 0


def test_missing_or_bad_token_is_401(client: TestClient) -> None:
    assert client.get("/api/v1/me").status_code == 401
    response = client.get("/api/v1/me", headers={"Authorization": "Bearer sxwl_nope"})
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"


def test_logout_revokes_only_that_token(client: TestClient) -> None:
    register(client, "owner@example.com")
    first, second = login(client, "owner@example.com"), login(client, "owner@example.com")
    assert client.post("/api/v1/auth/logout", headers=first).status_code == 204
    assert client.get("/api/v1/me", headers=first).status_code == 401
    assert client.get("/api/v1/me", headers=second).status_code == 200


def test_password_change_revokes_every_session(client: TestClient) -> None:
    register(client, "owner@example.com")
    first, second = login(client, "owner@example.com"), login(client, "owner@example.com")
    wrong = client.post(
        "/api/v1/me/password",
        headers=first,
        json={"current_password": "not it at all", "new_password": "brand new pass"},
    )
    assert wrong.status_code == 422
    assert wrong.json()["error"]["details"][0]["field"] == "current_password"
    short = client.post(
        "/api/v1/me/password",
        headers=first,
        json={"current_password": "correct horse", "new_password": "tiny"},
    )
    assert short.status_code == 422
    assert client.get("/api/v1/me", headers=second).status_code == 200

    ok = client.post(
        "/api/v1/me/password",
        headers=first,
        json={"current_password": "correct horse", "new_password": "brand new pass"},
    )
    assert ok.status_code == 204
    assert client.get("/api/v1/me", headers=first).status_code == 401
    assert client.get("/api/v1/me", headers=second).status_code == 401
    assert (
        client.post(
            "/api/v1/auth/login", json={"email": "owner@example.com", "password": "correct horse"}
        ).status_code
        == 401
    )
    login(client, "owner@example.com", "brand new pass")


def test_login_rate_limit_per_account(make_client: Callable[..., TestClient]) -> None:
    client = make_client(rate_login_account="3/60", rate_login_ip="100/60", login_locked_delay_s=0)
    register(client, "owner@example.com")
    for _ in range(3):
        client.post("/api/v1/auth/login", json={"email": "owner@example.com", "password": "wrong password"})
    # A wrong password is refused while the account is throttled (the right one is not:
    # tests/test_login_policy.py).
    limited = client.post(
        "/api/v1/auth/login", json={"email": "OWNER@example.com", "password": "still wrong"}
    )
    assert limited.status_code == 429
    assert limited.json()["error"]["code"] == "too_many_requests"
    assert int(limited.headers["Retry-After"]) >= 1
    # Another account from the same address is not affected.
    register(client, "other@example.com")
    login(client, "other@example.com")


def test_login_rate_limit_per_ip(make_client: Callable[..., TestClient]) -> None:
    client = make_client(rate_login_ip="4/60", rate_login_account="100/60")
    for i in range(4):
        client.post("/api/v1/auth/login", json={"email": f"u{i}@example.com", "password": "whatever it is"})
    assert (
        client.post(
            "/api/v1/auth/login", json={"email": "u9@example.com", "password": "whatever it is"}
        ).status_code
        == 429
    )


def test_registration_rate_limits(make_client: Callable[..., TestClient]) -> None:
    client = make_client(rate_register_ip="2/3600", rate_register_account="100/3600")
    register(client, "a@example.com")
    register(client, "b@example.com")
    response = client.post(
        "/api/v1/auth/register", json={"email": "c@example.com", "password": "long enough", "role": "user"}
    )
    assert response.status_code == 429
    assert counts(client)[0] == 2

    client = make_client(rate_register_ip="100/3600", rate_register_account="1/3600")
    client.post(
        "/api/v1/auth/register", json={"email": "d@example.com", "password": "long enough", "role": "user"}
    )
    again = client.post(
        "/api/v1/auth/register", json={"email": "D@example.com", "password": "long enough", "role": "user"}
    )
    assert again.status_code == 429


def test_oversize_body_is_413_and_writes_nothing(make_client: Callable[..., TestClient]) -> None:
    client = make_client(max_body_bytes=2048)
    body = {"email": "a@example.com", "password": "long enough", "role": "provider", "name": "x" * 5000}
    response = client.post("/api/v1/auth/register", json=body)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "too_large"
    assert counts(client) == (0, 0, 0)


def test_oversize_streamed_body_without_length_is_413(make_client: Callable[..., TestClient]) -> None:
    client = make_client(max_body_bytes=1024)

    def chunks() -> object:
        for _ in range(10):
            yield b"x" * 512

    response = client.post(
        "/api/v1/auth/register",
        content=chunks(),
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 413
    assert counts(client) == (0, 0, 0)


def test_errors_use_the_contract_body_everywhere(client: TestClient) -> None:
    for response in (
        client.get("/api/v1/nope"),
        client.delete("/api/v1/me"),
        client.post("/api/v1/auth/login", content=b"{not json", headers={"content-type": "application/json"}),
    ):
        assert response.status_code in (404, 405, 422)
        assert set(response.json()["error"]) == {"code", "message", "details"}
