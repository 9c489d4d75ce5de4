"""Admins list and create users; nobody else may."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fastapi.testclient import TestClient

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import Role
from sxwl.cloud.services.accounts import accounts
from tests.conftest import login, register


def make_admin(client: TestClient, email: str = "root@example.com") -> dict[str, str]:
    ctx: CloudContext = client.app.state.ctx  # type: ignore[attr-defined]
    with ctx.db.session() as session:
        accounts.create_user(ctx, session, accounts.NewAccount(email, "admin password", Role.ADMIN))
    return login(client, email, "admin password")


def test_admin_lists_users_with_pagination_filter_and_search(client: TestClient) -> None:
    admin = make_admin(client)
    for i in range(5):
        register(client, f"p{i}@example.com", "provider")
    register(client, "dev@example.com", "user")

    page1 = client.get("/api/v1/admin/users?per_page=4", headers=admin).json()
    page2 = client.get("/api/v1/admin/users?per_page=4&page=2", headers=admin).json()
    assert page1["total"] == page2["total"] == 7
    emails = {u["email"] for u in page1["items"] + page2["items"]}
    assert len(page1["items"]) == 4 and len(page2["items"]) == 3 and len(emails) == 7

    providers = client.get("/api/v1/admin/users?role=provider", headers=admin).json()
    assert providers["total"] == 5
    found = client.get("/api/v1/admin/users?q=DEV@", headers=admin).json()
    assert [u["email"] for u in found["items"]] == ["dev@example.com"]
    assert client.get("/api/v1/admin/users?role=wizard", headers=admin).status_code == 422
    assert client.get("/api/v1/admin/users?per_page=0", headers=admin).status_code == 422


def test_admin_creates_accounts_of_any_role(client: TestClient) -> None:
    admin = make_admin(client)
    response = client.post(
        "/api/v1/admin/users",
        headers=admin,
        json={"email": "ops@example.com", "password": "long enough", "role": "admin"},
    )
    assert response.status_code == 201
    assert response.json()["role"] == "admin"
    provider = client.post(
        "/api/v1/admin/users",
        headers=admin,
        json={"email": "gpu@example.com", "password": "long enough", "role": "provider"},
    )
    assert provider.status_code == 201
    # A provider created by an admin has its accessKey, recorded as created by that admin.
    history = client.get(
        "/api/v1/me/access-key/history", headers=login(client, "gpu@example.com", "long enough")
    )
    assert history.json()[0]["created_by"] == "root@example.com"


def test_non_admins_are_refused(client: TestClient) -> None:
    register(client, "owner@example.com", "provider")
    register(client, "dev@example.com", "user")
    for email in ("owner@example.com", "dev@example.com"):
        headers = login(client, email)
        assert client.get("/api/v1/admin/users", headers=headers).status_code == 403
        created = client.post(
            "/api/v1/admin/users",
            headers=headers,
            json={"email": "x@example.com", "password": "long enough", "role": "admin"},
        )
        assert created.status_code == 403


def test_admin_cli_creates_an_admin(tmp_path: Path, db_url: str) -> None:
    env = {
        **os.environ,
        "SXWL_DATABASE_URL": db_url,
        "SXWL_SECRET_KEY": "k" * 32,
        "SXWL_ARGON2_TIME_COST": "1",
        "SXWL_ARGON2_MEMORY_KIB": "1024",
    }

    def create(email: str, role: str, password: str) -> subprocess.CompletedProcess[str]:
        cmd = [
            sys.executable,
            "-m",
            "sxwl.cli",
            "admin",
            "create-user",
            "--email",
            email,
            "--role",
            role,
            "--password-stdin",
            "--data-dir",
            str(tmp_path),
        ]
        return subprocess.run(cmd, input=password + "\n", env=env, capture_output=True, text=True, timeout=60)

    done = create("Boss@Example.com", "admin", "admin password")
    assert done.returncode == 0, done.stderr
    assert "created admin boss@example.com" in done.stdout
    again = create("boss@example.com", "admin", "admin password")
    assert again.returncode == 1 and "already exists" in again.stderr
    short = create("x@example.com", "admin", "short")
    assert short.returncode == 2 and "password" in short.stderr
    bad_role = create("y@example.com", "wizard", "admin password")
    assert bad_role.returncode == 2 and "--role" in bad_role.stderr
    bad_email = create("not an email", "admin", "admin password")
    assert bad_email.returncode == 2 and "--email" in bad_email.stderr


def test_admin_cli_sets_a_gpu_limit(tmp_path: Path, db_url: str) -> None:
    env = {
        **os.environ,
        "SXWL_DATABASE_URL": db_url,
        "SXWL_SECRET_KEY": "k" * 32,
        "SXWL_ARGON2_TIME_COST": "1",
        "SXWL_ARGON2_MEMORY_KIB": "1024",
    }
    base = [sys.executable, "-m", "sxwl.cli", "admin"]
    made = subprocess.run(
        [
            *base,
            "create-user",
            "--email",
            "dev@example.com",
            "--role",
            "user",
            "--password-stdin",
            "--data-dir",
            str(tmp_path),
        ],
        input="long enough\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    done = subprocess.run(
        [
            *base,
            "set-gpu-limit",
            "--email",
            "DEV@example.com",
            "--max-gpus",
            "4",
            "--data-dir",
            str(tmp_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "at most 4" in done.stdout
    unknown = subprocess.run(
        [
            *base,
            "set-gpu-limit",
            "--email",
            "nobody@example.com",
            "--max-gpus",
            "4",
            "--data-dir",
            str(tmp_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unknown.returncode == 2 and "no account" in unknown.stderr
