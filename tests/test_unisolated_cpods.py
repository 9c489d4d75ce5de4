"""CPods whose agent cannot isolate jobs take only their provider's and trusted accounts' jobs: the
scheduler never places another account's job there, says why it waits, and 算力详情 says so."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from sxwl.cloud.services.scheduling import scheduler
from tests.conftest import login, register
from tests.support.agent import eventually
from tests.support.cpods import access_key, beat, gpu_node, register_cpod
from tests.test_console_compute import ctx_of, form_login
from tests.test_jobs_process import World

PRODUCT = "NVIDIA-A100-SXM4-80GB"


def submit(client: TestClient, headers: dict[str, str], **extra: object) -> str:
    body = {"name": "t", "command": "true", "gpu_product": PRODUCT, "gpus_per_node": 1, **extra}
    response = client.post("/api/v1/jobs", headers=headers, json=body)
    assert response.status_code == 201, response.text
    job_id: str = response.json()["id"]
    return job_id


def placed_jobs(client: TestClient, jobs: list[tuple[dict[str, str], str]]) -> set[str]:
    """Those of ``jobs`` (each with its owner's headers) that are no longer queued."""
    return {
        job_id
        for headers, job_id in jobs
        if client.get(f"/api/v1/jobs/{job_id}", headers=headers).json()["state"] != "queued"
    }


def test_only_trusted_accounts_jobs_are_placed_and_the_page_says_so(client: TestClient) -> None:
    register(client, "gpu@example.com")
    provider = login(client, "gpu@example.com")
    for email in ("friend@example.com", "stranger@example.com"):
        register(client, email, role="user")
    friend, stranger = login(client, "friend@example.com"), login(client, "stranger@example.com")
    key = access_key(client, provider)
    cpod = register_cpod(client, key, isolation="none", trusted_accounts=["Friend@Example.com"])
    assert beat(client, cpod["cpod_token"], 1, [gpu_node("n1", count=8)]).status_code == 200
    theirs = submit(client, stranger)
    pinned = submit(client, stranger, cpod_id=cpod["cpod_id"])
    ours = submit(client, friend)
    # The app's own scheduling loop may place them before this pass does: read the jobs' states.
    scheduler.schedule_once(ctx_of(client))
    assert placed_jobs(client, [(friend, ours), (stranger, theirs), (stranger, pinned)]) == {ours}
    for job_id in (theirs, pinned):
        job = client.get(f"/api/v1/jobs/{job_id}", headers=stranger).json()
        assert job["state"] == "queued" and "without isolation" in job["reason"], job
    page = form_login(client, "gpu@example.com", "correct horse").get("/compute").text
    assert "只运行以下账户的任务：gpu@example.com, friend@example.com" in page
    assert client.get("/api/v1/cpods", headers=provider).json()[0]["isolation"] == "none"
    # The agent restarts isolated (bubblewrap installed, say): from the next pass anyone's jobs fit.
    reply = client.put(
        "/api/v1/agent/isolation",
        headers={"Authorization": f"Bearer {cpod['cpod_token']}"},
        json={"isolation": "isolated"},
    )
    assert reply.status_code == 200 and reply.json() == {"accepted_owner_ids": None}
    scheduler.schedule_once(ctx_of(client))
    assert placed_jobs(client, [(friend, ours), (stranger, theirs), (stranger, pinned)]) == {
        ours,
        theirs,
        pinned,
    }
    page = form_login(client, "gpu@example.com", "correct horse").get("/compute").text
    assert "只运行以下账户的任务" not in page


def test_an_unknown_trusted_account_is_refused_naming_the_field(client: TestClient) -> None:
    register(client, "gpu@example.com")
    key = access_key(client, login(client, "gpu@example.com"))
    response = client.post(
        "/api/v1/agent/register",
        headers={"Authorization": f"Bearer {key}"},
        json={
            "cluster_uid": "cluster-0001",
            "runtime": "local",
            "agent_version": "t",
            "isolation": "none",
            "trusted_accounts": ["nobody@example.com"],
        },
    )
    assert response.status_code == 422
    assert response.json()["error"]["details"][0]["field"] == "trusted_accounts[0]"
    assert client.get("/api/v1/cpods", headers=login(client, "gpu@example.com")).json() == []


@pytest.fixture
def world(tmp_path: Path, db_url: str) -> Iterator[World]:
    w = World(tmp_path, db_url)
    yield w
    w.close()


def test_an_agent_without_isolation_runs_only_trusted_jobs(world: World) -> None:
    agent = world.agent("a", 4, "--isolation", "none", "--trust-account", "friend@example.com")
    friend = world.account("friend@example.com", "user")
    world.online()
    assert "JOBS ARE NOT ISOLATED" in agent.log and "friend@example.com" in agent.log
    stranger = world.submit("echo hi")
    body = {"name": "t", "command": "echo from-friend", "gpu_product": PRODUCT, "gpus_per_node": 1}
    trusted = httpx.post(f"{world.url}/api/v1/jobs", headers=friend, json=body).json()["id"]
    job = eventually(
        lambda: (
            (j := httpx.get(f"{world.url}/api/v1/jobs/{trusted}", headers=friend).json())["state"]
            == "succeeded"
            and j
        ),
        what="the trusted account's job to succeed",
    )
    assert job["exit_code"] == 0
    waiting = world.job(stranger)
    assert waiting["state"] == "queued" and "without isolation" in waiting["reason"]
