"""Endpoints through the whole system (docs/endpoints.md): `sxwl serve` with billing on, a real
`sxwl-agent` whose local runtime runs the replica in its sandbox, the engine `transformers serve`
serving the tiny Llama on CPUs, reached only through the agent's tunnel. A user calls it with the
official `openai` client, with and without streaming; usage, cost and the ledger are checked after."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from sxwl.cloud.db.models import JobAttempt
from sxwl.cloud.services.money import ledger
from tests.support.agent import AgentProcess, eventually
from tests.support.browser import api_token, create_admin
from tests.support.outbound_only import Relay
from tests.test_finetune_system import MODEL, FineTuneWorld

pytest.importorskip("peft", reason="the CPU engine needs the training extra: pip install -e '.[train]'")
openai = pytest.importorskip("openai")
URL = "/api/v1/endpoints"
OUTBOUND_ONLY = Path(__file__).parent / "support" / "outbound_only.py"


class ServingWorld(FineTuneWorld):
    def __init__(self, root: Path, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
        # A CPod whose CPUs are busy generating may miss a quick heartbeat: a longer grace keeps the
        # replica's attempt where it is (a requeue is another test's subject).
        env = {
            "SXWL_BILLING_ENABLED": "true",
            "SXWL_METERING_INTERVAL_S": "0.5",
            "SXWL_OFFLINE_GRACE_S": "10",
        }
        super().__init__(root, db_url, **env)
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

    def outbound_agent(self, name: str) -> AgentProcess:
        """An agent in a network namespace of its own with only its loopback: it dials the cloud
        through tests/support/outbound_only.py's one door and accepts nothing."""
        self.door_dir = Path(tempfile.mkdtemp(prefix="sxwl-door-"))  # a unix socket's path is short
        door = self.door_dir / "cloud.sock"
        self.relay = Relay(door, self.port)
        wrapper = self.root / "outbound-python"
        wrapper.write_text(
            f"#!/bin/sh\nexec unshare --net -- {sys.executable} {OUTBOUND_ONLY} {door} {self.port} -- "
            f'{sys.executable} "$@"\n'
        )
        wrapper.chmod(0o755)
        return self.agent(name, python=str(wrapper))

    def close(self) -> None:
        # Every endpoint deleted and its replicas stopped before the agent goes: a replica's engine
        # runs in its own sessions and would outlive it (a test that failed midway included).
        try:
            live = httpx.get(f"{self.url}{URL}", headers=self.user).json()
            for endpoint in live:
                stopped = httpx.delete(f"{self.url}{URL}/{endpoint['id']}", headers=self.user).json()
                for replica in stopped["replica_jobs"]:
                    self.wait_state(replica["job_id"], "cancelled", "failed", timeout=60)
        finally:
            super().close()
        if hasattr(self, "relay"):
            self.relay.close()
            shutil.rmtree(self.door_dir, ignore_errors=True)

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
    agent = sworld.outbound_agent("a")
    sworld.online()
    # The CPod accepts no inbound connection: its agent's network namespace is not ours and has no
    # interface but its loopback, so there is no address at which to reach it.
    assert os.readlink(f"/proc/{agent.proc.pid}/ns/net") != os.readlink("/proc/self/ns/net")
    interfaces = [
        line.split(":")[0].strip()
        for line in Path(f"/proc/{agent.proc.pid}/net/dev").read_text().splitlines()[2:]
    ]
    assert interfaces == ["lo"]
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

    # An inference key calls it as well, and its usage is its own.
    made = httpx.post(f"{sworld.url}/api/v1/keys", headers=sworld.user, json={"name": "script"}).json()
    keyed = openai.OpenAI(api_key=made["key"], base_url=f"{sworld.url}/v1", max_retries=0)
    assert keyed.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )

    # Usage from the engine's answers, per endpoint, credential and day.
    by_key = {day["key_id"]: day for day in sworld.endpoint(endpoint_id)["usage"]}
    assert set(by_key) == {None, made["id"]}
    mine = by_key[None]
    assert mine["requests"] == 3 and mine["completion_tokens"] == 5 + 4 + 3 and mine["prompt_tokens"] > 0
    assert by_key[made["id"]]["requests"] == 1 and by_key[made["id"]]["completion_tokens"] == 2

    # Nothing but the agent reaches the engine: it listens in the sandbox's own network namespace
    # (no port of ours nor of the agent's namespace is its), and its socket is the attempt's alone.
    sockets = list((sworld.root / "agent-a" / "jobs").glob(f"{replica['job_id']}*/work/engine.sock"))
    assert len(sockets) == 1 and stat.S_IMODE(os.stat(sockets[0]).st_mode) == 0o600
    listening = [
        line
        for table in ("/proc/net/tcp", f"/proc/{agent.proc.pid}/net/tcp")
        for line in Path(table).read_text().splitlines()[1:]
    ]
    assert not [line for line in listening if line.split()[1].endswith(":1F40") and line.split()[3] == "0A"]

    deleted = httpx.delete(f"{sworld.url}{URL}/{endpoint_id}", headers=sworld.user).json()
    assert deleted["state"] == "stopped"
    sworld.wait_state(replica["job_id"], "cancelled", timeout=60)

    # Billed as a job: per core-second from running to its end, into the ledger, which adds up.
    def rated() -> bool:
        with Session(engine) as session:
            placed = session.scalars(select(JobAttempt).where(JobAttempt.job_id == replica["job_id"])).all()
            return all(attempt.rated_done for attempt in placed)

    engine = create_engine(sworld.env["SXWL_DATABASE_URL"])
    try:
        eventually(rated, timeout=30, what="the replica rated to its end")
        assert sworld.job(replica["job_id"])["cost"] > 0
        statement = httpx.get(f"{sworld.url}/api/v1/billing/statement", headers=sworld.user).json()
        assert {line["job_id"] for line in statement["lines"]} == {replica["job_id"]}
        with Session(engine) as session:
            assert ledger.check(session).ok
    finally:
        engine.dispose()


def test_the_adapter_of_a_real_fine_tune_is_deployed_and_answers(sworld: ServingWorld) -> None:
    sworld.outbound_agent("a")
    sworld.online()
    training = sworld.dataset(8)
    job = sworld.api.fine_tuning.jobs.create(
        model=MODEL,
        training_file=training,
        hyperparameters={"n_epochs": 1, "batch_size": 4},
        suffix="served",
        extra_body={"gpus": 0},
    )
    done = sworld.wait_status(job.id, "succeeded", "failed", "cancelled")
    assert done.status == "succeeded", sworld.messages(job.id)
    created = httpx.post(
        f"{sworld.url}{URL}",
        headers=sworld.user,
        json={"name": "tuned", "model": done.fine_tuned_model, "gpus": 0},
    )
    assert created.status_code == 201, created.text
    endpoint_id = created.json()["id"]
    ready = sworld.wait_endpoint(endpoint_id, "ready", "failed")
    (replica,) = ready["replica_jobs"]
    log = sworld.logs(replica["job_id"])
    assert ready["state"] == "ready", log
    assert "merging the adapter into its base model" in log  # transformers serve loads one directory
    answer = sworld.api.chat.completions.create(
        model="tuned", messages=[{"role": "user", "content": "Translate to Chinese: cat"}], max_tokens=3
    )
    assert answer.usage is not None and answer.usage.completion_tokens == 3
    # Called by the model it serves, too.
    again = sworld.api.completions.create(model=done.fine_tuned_model, prompt="cat", max_tokens=2)
    assert again.usage is not None and again.usage.completion_tokens == 2
    httpx.delete(f"{sworld.url}{URL}/{endpoint_id}", headers=sworld.user).raise_for_status()
    sworld.wait_state(replica["job_id"], "cancelled", timeout=60)
