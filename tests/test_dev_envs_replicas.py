"""A dev environment through a replica that does not hold its CPod's tunnel (docs/dev-envs.md,
docs/tunnel.md "Several replicas"): two `sxwl serve` replicas on one PostgreSQL, the agent dialling
r1 only, the owner's browser on r2, which relays the Jupyter API and a kernel's WebSocket to r1."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import httpx
import pytest

from tests.support.agent import eventually, simulated_agent
from tests.support.browser import PASSWORD, api_token
from tests.support.cloud import CloudProcess
from tests.support.net import free_port
from tests.support.postgres import TempPostgres
from tests.support.tunnel import provider_key
from tests.test_dev_envs import console, kernel_says, stop_all

pytest.importorskip("jupyterlab", reason="JupyterLab comes with the devenv extra")


def test_jupyterlab_is_reached_through_a_replica_without_the_tunnel(
    tmp_path: Path, postgres: TempPostgres
) -> None:
    database, key = postgres.create_database(), secrets.token_urlsafe(48)
    replicas = []
    for name in ("r1", "r2"):
        port = free_port()
        env = {
            "SXWL_DATABASE_URL": database,
            "SXWL_SECRET_KEY": key,
            "SXWL_REPLICA_URL": f"http://127.0.0.1:{port}",
            "SXWL_SCHEDULER_INTERVAL_S": "0.2",
        }
        replicas.append(CloudProcess(tmp_path / name, port, env=env))
    r1, r2 = replicas
    user: dict[str, str] = {}
    agent = simulated_agent(
        r1.url,
        tmp_path / "agent",
        provider_key(r1.url),
        "--tunnel-connections",
        "1",
        name="r1-only",
        gpus=1,
        product="SIM",
    )
    try:
        eventually(lambda: (tmp_path / "agent" / "cpod.json").exists(), what="the agent to register")
        body = {"email": "dev@example.com", "password": PASSWORD, "role": "user"}
        httpx.post(f"{r2.url}/api/v1/auth/register", json=body).raise_for_status()
        user["Authorization"] = f"Bearer {api_token(r2.url, 'dev@example.com')}"
        created = httpx.post(f"{r2.url}/api/v1/dev-envs", headers=user, json={"name": "far", "gpus": 1})
        assert created.status_code == 201, created.text
        env_id = created.json()["id"]

        def running() -> bool:
            return bool(
                httpx.get(f"{r2.url}/api/v1/dev-envs/{env_id}", headers=user).json()["status"] == "running"
            )

        eventually(running, timeout=60, what="the environment to run")
        browser = console(r2.url, "dev@example.com")
        base = f"/dev/{env_id}"
        eventually(
            lambda: browser.get(f"{base}/api/status").status_code == 200, timeout=90, what="JupyterLab via r2"
        )
        assert json.loads(browser.get(f"{base}/api/contents").text)["type"] == "directory"
        browser.get(f"{base}/lab")
        xsrf = {"X-XSRFToken": browser.cookies.get("_xsrf") or ""}
        kernel = browser.post(f"{base}/api/kernels", json={"name": "python3"}, headers=xsrf)
        assert kernel.status_code == 201, kernel.text
        assert kernel_says(r2.url, browser, env_id, kernel.json()["id"], "6*7") == "42"
        # The agent's tunnel is r1's alone; r2 reached it through the relay between replicas.
        r1_log, r2_log = ((tmp_path / name / "cloud.log").read_text() for name in ("r1", "r2"))
        assert "WebSocket /api/v1/agent/tunnel" in r1_log and "/api/v1/agent/tunnel" not in r2_log
        assert "WebSocket /internal/tunnel-relay" in r1_log
        assert httpx.delete(f"{r2.url}/api/v1/dev-envs/{env_id}", headers=user).status_code == 200
    finally:
        try:
            if user:
                stop_all(r2.url, user)  # its processes end before the agent does
        finally:
            agent.stop()
        r2.stop()
        r1.stop()
