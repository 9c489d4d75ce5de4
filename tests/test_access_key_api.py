"""The provider's accessKey: shown again, rotated at once, recorded, never stored in plain text."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import select

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import AccessKey
from sxwl.cloud.kit.security import token_hash
from tests.conftest import login, register


def stored_keys(client: TestClient) -> list[AccessKey]:
    ctx: CloudContext = client.app.state.ctx  # type: ignore[attr-defined]
    with ctx.db.session() as session:
        return list(session.scalars(select(AccessKey).order_by(AccessKey.created_at)))


def test_provider_gets_a_recognisable_high_entropy_key(client: TestClient) -> None:
    register(client, "owner@example.com")
    headers = login(client, "owner@example.com")
    key = client.get("/api/v1/me/access-key", headers=headers).json()["access_key"]
    assert key.startswith("sxak_")
    assert len(key) >= 5 + 43  # 32 random bytes, base64url
    # The same key is shown again, as the guide promises.
    assert client.get("/api/v1/me/access-key", headers=headers).json()["access_key"] == key


def test_key_is_stored_hashed_and_encrypted_never_plain(client: TestClient) -> None:
    register(client, "owner@example.com")
    key = client.get("/api/v1/me/access-key", headers=login(client, "owner@example.com")).json()["access_key"]
    (row,) = stored_keys(client)
    assert row.key_hash == token_hash(key)
    assert key not in row.key_encrypted
    assert row.hint == key[-4:]


def test_rotation_invalidates_the_old_key_and_is_recorded(client: TestClient) -> None:
    owner = register(client, "owner@example.com")
    headers = login(client, "owner@example.com")
    old = client.get("/api/v1/me/access-key", headers=headers).json()["access_key"]
    rotated = client.post("/api/v1/me/access-key/rotate", headers=headers)
    assert rotated.status_code == 200
    new = rotated.json()["access_key"]
    assert new != old and new.startswith("sxak_")
    assert client.get("/api/v1/me/access-key", headers=headers).json()["access_key"] == new

    old_row, new_row = stored_keys(client)
    assert old_row.key_hash == token_hash(old)
    assert old_row.revoked_at is not None and old_row.revoked_by_id == owner["id"]
    assert new_row.revoked_at is None and new_row.created_by_id == owner["id"]

    history = client.get("/api/v1/me/access-key/history", headers=headers).json()
    assert [h["hint"] for h in history] == [new[-4:], old[-4:]]
    assert history[1]["revoked_by"] == "owner@example.com"
    assert history[0]["created_by"] == "owner@example.com"
    assert history[0]["revoked_at"] is None


def test_compute_users_get_403_and_nothing_changes(client: TestClient) -> None:
    register(client, "dev@example.com", role="user")
    headers = login(client, "dev@example.com")
    for method, path in (
        ("GET", "/api/v1/me/access-key"),
        ("POST", "/api/v1/me/access-key/rotate"),
    ):
        response = client.request(method, path, headers=headers)
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "not_a_provider"
    assert stored_keys(client) == []


def test_keys_need_a_sign_in(client: TestClient) -> None:
    assert client.get("/api/v1/me/access-key").status_code == 401
    assert client.post("/api/v1/me/access-key/rotate").status_code == 401


def test_key_survives_a_restart_with_the_same_secret(client: TestClient, make_client: object) -> None:
    register(client, "owner@example.com")
    key = client.get("/api/v1/me/access-key", headers=login(client, "owner@example.com")).json()["access_key"]
    again = make_client()  # type: ignore[operator]
    assert (
        again.get("/api/v1/me/access-key", headers=login(again, "owner@example.com")).json()["access_key"]
        == key
    )
