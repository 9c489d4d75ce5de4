"""Every answer that carries a secret or a statement says ``Cache-Control: no-store``, so no
browser or proxy cache keeps a copy: the API's token at sign-in and the console's session cookie
(sign-in and sign-up), the accessKey (shown and rotated), a CPod's token, the assignments with
their pods' upload tokens, an upload target, and statements and earnings, as JSON and as CSV."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from fastapi.testclient import TestClient
from httpx import Response

from tests.conftest import login, register
from tests.test_console_forms import csrf
from tests.test_jobs_api import Setup


def _no_store(response: Response) -> None:
    assert response.status_code in (200, 303), response.text
    assert response.headers.get("cache-control") == "no-store", (str(response.url), response.headers)


def test_api_answers_with_secrets_or_statements_are_not_stored(client: TestClient) -> None:
    register(client, "p@example.com", "provider")
    credentials = {"email": "p@example.com", "password": "correct horse"}
    signed_in = client.post("/api/v1/auth/login", json=credentials)
    _no_store(signed_in)
    provider = {"Authorization": f"Bearer {signed_in.json()['access_token']}"}
    _no_store(client.get("/api/v1/me/access-key", headers=provider))
    rotated = client.post("/api/v1/me/access-key/rotate", headers=provider)
    _no_store(rotated)
    cpod = client.post(
        "/api/v1/agent/register",
        headers={"Authorization": f"Bearer {rotated.json()['access_key']}"},
        json={"cluster_uid": "cluster-nostore", "runtime": "local", "agent_version": "t"},
    )
    _no_store(cpod)
    assert cpod.json()["cpod_token"]
    for kind in ("json", "csv"):
        _no_store(client.get("/api/v1/earnings", headers=provider, params={"format": kind}))

    setup = Setup(client)
    job = setup.submit(gpus_per_node=1)
    assignments = client.get("/api/v1/agent/assignments", headers=setup.agent, params={"wait": 5})
    _no_store(assignments)
    assert [a["job_id"] for a in assignments.json()["assignments"]] == [job["id"]]
    assert setup.status(job["id"], 1, "running").status_code == 200
    data = b"an output"
    target = client.post(
        f"/api/v1/agent/jobs/{job['id']}/upload-targets",
        headers=setup.agent,
        params={"attempt": 1},
        json={"path": "out.txt", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()},
    )
    _no_store(target)
    for kind in ("json", "csv"):
        _no_store(client.get("/api/v1/billing/statement", headers=setup.user, params={"format": kind}))


def test_the_consoles_sign_in_and_sign_up_are_not_stored(client: TestClient) -> None:
    token = csrf(client, "/register?role=user")
    form = {"csrf_token": token, "role": "user", "email": "dev@example.com", "password": "correct horse"}
    signed_up = client.post("/register", data=form, follow_redirects=False)
    _no_store(signed_up)
    assert any(v.startswith("sxwl_session=") for v in signed_up.headers.get_list("set-cookie"))
    client.cookies.clear()
    token = csrf(client, "/login")
    form = {"csrf_token": token, "email": "dev@example.com", "password": "correct horse"}
    signed_in = client.post("/login", data=form, follow_redirects=False)
    _no_store(signed_in)
    assert any(v.startswith("sxwl_session=") for v in signed_in.headers.get_list("set-cookie"))
    assert login(client, "dev@example.com")  # the API's sign-in still works beside it


def test_a_held_long_poll_is_not_stored(make_client: Callable[..., TestClient]) -> None:
    client = make_client(longpoll_keepalive_s=0.2)  # streamed: its head goes before its answer
    setup = Setup(client)
    held = client.get("/api/v1/agent/assignments", headers=setup.agent, params={"wait": 1})
    _no_store(held)
    assert held.text.startswith("\n") and held.json()["assignments"] == []
