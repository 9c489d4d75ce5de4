"""An endpoint with two cloud replicas on one PostgreSQL (docs/endpoints.md; docs/tunnel.md,
"Several replicas"): the CPod's agent (simulated GPUs, the recording vLLM stand-in) dials replica
r1 only, the user deploys and calls through r2, which relays each call to r1's tunnel. The `openai`
client works unchanged, with and without streaming."""

from __future__ import annotations

import functools
import os
import secrets
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.agent import eventually, simulated_agent
from tests.support.cloud import CloudProcess
from tests.support.net import free_port
from tests.support.postgres import TempPostgres
from tests.support.tiny_finetune import build_model, register_public_model
from tests.test_endpoints_vllm import FAKE
from tests.test_jobs_process import CLOUD_ENV, PRODUCT

openai = pytest.importorskip("openai")
MODEL = "tiny-llama"


def _account(url: str, email: str, role: str) -> dict[str, str]:
    body = {"email": email, "password": "correct horse", "role": role}
    httpx.post(f"{url}/api/v1/auth/register", json=body).raise_for_status()
    token = httpx.post(f"{url}/api/v1/auth/login", json={"email": email, "password": "correct horse"})
    return {"Authorization": f"Bearer {token.json()['access_token']}"}


def _stopped(url: str, user: dict[str, str], endpoint_id: str) -> bool:
    found = httpx.get(f"{url}/api/v1/endpoints/{endpoint_id}", headers=user).json()
    return all(r["state"] in ("cancelled", "failed") for r in found["replica_jobs"])


def test_a_call_on_the_replica_without_the_tunnel_is_relayed_to_the_one_with_it(
    tmp_path: Path, postgres: TempPostgres
) -> None:
    database = postgres.create_database()
    shared = {
        **CLOUD_ENV,
        "SXWL_DATABASE_URL": database,
        "SXWL_SECRET_KEY": secrets.token_urlsafe(48),
        # Callers and routes remembered for ten minutes: only the NOTIFY of a revocation can make
        # the other replica forget a key in time.
        "SXWL_CALL_CACHE_S": "600",
    }
    replicas: list[CloudProcess] = []
    agents = []
    try:
        for name in ("r1", "r2"):
            port = free_port()
            env = {**shared, "SXWL_REPLICA_URL": f"http://127.0.0.1:{port}"}
            replicas.append(CloudProcess(tmp_path / name, port, env=env))
        r1, r2 = (r.url for r in replicas)
        # The model's archive is in r1's store, where the agent (which knows only r1) fetches it.
        register_public_model(
            MODEL,
            build_model(tmp_path / MODEL),
            {**os.environ, **shared, "SXWL_DATA_DIR": str(tmp_path / "r1")},
        )
        provider = _account(r1, "owner@example.com", "provider")
        key = httpx.get(f"{r1}/api/v1/me/access-key", headers=provider).json()["access_key"]
        user = _account(r1, "dev@example.com", "user")
        fakebin = tmp_path / "fakebin"
        fakebin.mkdir()
        (fakebin / "vllm").write_text(f"#!{sys.executable}\n" + FAKE.read_text())
        (fakebin / "vllm").chmod(0o755)
        agents.append(
            simulated_agent(
                r1,
                tmp_path / "agent",
                key,
                "--share-dir",
                str(fakebin),
                name="behind-nat",
                gpus=1,
                product=PRODUCT,
                env={"PATH": f"{fakebin}:{os.environ['PATH']}"},
            )
        )

        def online() -> bool:
            cpods = httpx.get(f"{r1}/api/v1/cpods", headers=provider).json()
            return any(c["status"] == "online" for c in cpods)

        eventually(online, what="the CPod online")
        body = {"name": "chat", "model": MODEL, "gpus": 1, "gpu_product": PRODUCT}
        created = httpx.post(f"{r2}/api/v1/endpoints", headers=user, json=body)
        assert created.status_code == 201, created.text

        def ready() -> dict[str, Any] | None:
            found: dict[str, Any] = httpx.get(
                f"{r2}/api/v1/endpoints/{created.json()['id']}", headers=user
            ).json()
            return found if found["state"] == "ready" else None

        endpoint = eventually(ready, timeout=90, what="the endpoint ready")
        client = openai.OpenAI(
            api_key=user["Authorization"].removeprefix("Bearer "), base_url=f"{r2}/v1", max_retries=0
        )
        answers = [
            client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": str(i)}]
            ).choices[0]
            for i in range(5)
        ]
        assert {a.message.content for a in answers} == {"fake vllm says hi"}
        chunks = list(
            client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "hi"}], stream=True
            )
        )
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "fake vllm says hi "
        # A key remembered by r2, revoked through r1: r2 refuses its next call.
        created_key = httpx.post(f"{r1}/api/v1/keys", headers=user, json={"name": "ci"}).json()
        with_key = {"Authorization": f"Bearer {created_key['key']}"}
        call = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(f"{r2}/v1/chat/completions", headers=with_key, json=call).status_code == 200
        httpx.delete(f"{r1}/api/v1/keys/{created_key['id']}", headers=user).raise_for_status()
        eventually(
            lambda: httpx.post(f"{r2}/v1/chat/completions", headers=with_key, json=call).status_code == 401,
            timeout=10,
            what="the other replica to refuse the revoked key",
        )
        httpx.delete(f"{r2}/api/v1/endpoints/{endpoint['id']}", headers=user).raise_for_status()
        eventually(lambda: _stopped(r1, user, endpoint["id"]), timeout=60, what="the replica stopped")
    finally:
        # Endpoints left by a failure are stopped while their agent runs (their engines would
        # outlive it).
        for endpoint in httpx.get(f"{r2}/api/v1/endpoints", headers=user).json() if agents else []:
            httpx.delete(f"{r2}/api/v1/endpoints/{endpoint['id']}", headers=user)
            gone = functools.partial(_stopped, r2, user, endpoint["id"])
            eventually(gone, timeout=60, what="the replica stopped")
        for agent in agents:
            agent.stop()
        for replica in replicas:
            replica.stop()
