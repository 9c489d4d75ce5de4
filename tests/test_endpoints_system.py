"""Endpoints through the whole system (docs/endpoints.md): `sxwl serve` with billing on, a real
`sxwl-agent` whose local runtime runs the replica in its sandbox, the engine `transformers serve`
serving the tiny Llama on CPUs, reached only through the agent's tunnel. A user calls it with the
official `openai` client, with and without streaming; usage, cost and the ledger are checked after."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from sxwl.cloud.db.models import JobAttempt
from sxwl.cloud.services.money import ledger
from tests.support.agent import eventually
from tests.support.browser import api_token, create_admin
from tests.test_finetune_system import MODEL, FineTuneWorld

pytest.importorskip("peft", reason="the CPU engine needs the training extra: pip install -e '.[train]'")
openai = pytest.importorskip("openai")
URL = "/api/v1/endpoints"


class ServingWorld(FineTuneWorld):
    def __init__(self, root: Path, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__(root, db_url, SXWL_BILLING_ENABLED="true", SXWL_METERING_INTERVAL_S="0.5")
        monkeypatch.setenv("SXWL_DATABASE_URL", self.env["SXWL_DATABASE_URL"])  # for the admin's CLI
        create_admin(self.root / "cloud", "admin@example.com")
        self.admin = {"Authorization": f"Bearer {api_token(self.url, 'admin@example.com')}"}
        cpu = {"resource": "cpu", "price_per_hour_yuan": "36", "fee_percent": "10"}
        httpx.put(
            f"{self.url}/api/v1/admin/prices", headers=self.admin, json={"prices": [cpu]}
        ).raise_for_status()
        me = httpx.get(f"{self.url}/api/v1/me", headers=self.user).json()
        top_up = {"user_id": me["id"], "amount_yuan": "1000", "note": "test"}
        httpx.post(f"{self.url}/api/v1/admin/top-ups", headers=self.admin, json=top_up).raise_for_status()

    def endpoint(self, endpoint_id: str) -> dict[str, Any]:
        response = httpx.get(f"{self.url}{URL}/{endpoint_id}", headers=self.user)
        assert response.status_code == 200, response.text
        out: dict[str, Any] = response.json()
        return out

    def wait_endpoint(self, endpoint_id: str, *states: str, timeout: float = 240) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            found = self.endpoint(endpoint_id)
            return found if found["state"] in states else None

        return eventually(reached, timeout=timeout, what=f"endpoint {endpoint_id} {'/'.join(states)}")


@pytest.fixture
def sworld(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ServingWorld]:
    w = ServingWorld(tmp_path, f"sqlite:///{tmp_path / 'sxwl.db'}", monkeypatch)
    yield w
    w.close()


def test_the_openai_client_chats_with_the_tiny_llama_through_the_tunnel(sworld: ServingWorld) -> None:
    sworld.agent("a")
    sworld.online()
    created = httpx.post(
        f"{sworld.url}{URL}", headers=sworld.user, json={"name": "chat", "model": MODEL, "gpus": 0}
    )
    assert created.status_code == 201, created.text
    endpoint_id = created.json()["id"]
    ready = sworld.wait_endpoint(endpoint_id, "ready", "failed")
    assert ready["state"] == "ready", sworld.logs(ready["replica_jobs"][0]["job_id"])
    (replica,) = ready["replica_jobs"]

    answer = sworld.api.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "Translate to Chinese: cat"}], max_tokens=5
    )
    assert answer.model == "chat" and answer.choices[0].message.role == "assistant"
    assert answer.usage is not None and answer.usage.completion_tokens == 5

    stream = sworld.api.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(chunks) >= 3 and text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4

    legacy = sworld.api.completions.create(model="chat", prompt="hello", max_tokens=3)
    assert legacy.choices[0].text and legacy.usage is not None

    served = [m.id for m in sworld.api.models.list()]
    assert MODEL in served and "chat" in served
    with pytest.raises(openai.NotFoundError):
        sworld.api.chat.completions.create(model="nobody", messages=[{"role": "user", "content": "hi"}])

    # Usage from the engine's answers, per endpoint and day.
    (day,) = sworld.endpoint(endpoint_id)["usage"]
    assert day["requests"] == 3 and day["completion_tokens"] == 5 + 4 + 3 and day["prompt_tokens"] > 0

    # Nothing but the agent reaches the engine: it listens in the sandbox's own network namespace
    # (no port of the machine is its), and its socket is the attempt's alone.
    sockets = list((sworld.root / "agent-a" / "jobs").glob(f"{replica['job_id']}*/work/engine.sock"))
    assert len(sockets) == 1 and stat.S_IMODE(os.stat(sockets[0]).st_mode) == 0o600
    listening = Path("/proc/net/tcp").read_text().splitlines()[1:]
    assert not [line for line in listening if line.split()[1].endswith(":1F40") and line.split()[3] == "0A"]

    deleted = httpx.delete(f"{sworld.url}{URL}/{endpoint_id}", headers=sworld.user).json()
    assert deleted["state"] == "stopped"
    sworld.wait_state(replica["job_id"], "cancelled", timeout=60)

    # Billed as a job: per core-second from running to its end, into the ledger, which adds up.
    def rated() -> bool:
        with Session(engine) as session:
            placed = session.scalars(select(JobAttempt).where(JobAttempt.job_id == replica["job_id"])).one()
            return placed.rated_done

    engine = create_engine(sworld.env["SXWL_DATABASE_URL"])
    try:
        eventually(rated, timeout=30, what="the replica rated to its end")
        assert sworld.job(replica["job_id"])["cost"] > 0
        statement = httpx.get(f"{sworld.url}/api/v1/billing/statement", headers=sworld.user).json()
        assert [line["job_id"] for line in statement["lines"]] == [replica["job_id"]]
        with Session(engine) as session:
            assert ledger.check(session).ok
    finally:
        engine.dispose()
