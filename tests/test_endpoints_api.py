"""Endpoints through the REST API (docs/endpoints.md), with the CPod's agent driven by hand over the
agent protocol: a replica is a job of the endpoint kind with its engine and inputs, the endpoint's
state follows its replicas, it is billed as jobs are, and bad input is refused naming the field."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sxwl.cloud.db.finetune_models import ModelKind
from sxwl.cloud.services.scheduling import scheduler
from tests.conftest import login, register
from tests.support.billing_api import BILLING, PRODUCT, Money
from tests.support.clock import TestClock
from tests.support.finetune_rows import add_model

BASE = "tiny-llama"
ADAPTER = f"ft:{BASE}:demo:ftjob-1"
URL = "/api/v1/endpoints"


class Endpoints(Money):
    def __init__(self, client: TestClient, clock: TestClock) -> None:
        super().__init__(client, clock)
        self.base_id = add_model(self.ctx, BASE, b"a model directory, as a tar" * 50)

    def create(self, **body: Any) -> Any:
        payload = {"name": "chat", "model": BASE, "gpus": 1, "gpu_product": PRODUCT} | body
        return self.client.post(URL, headers=self.user, json=payload)

    def created(self, **body: Any) -> dict[str, Any]:
        response = self.create(**body)
        assert response.status_code == 201, response.text
        out: dict[str, Any] = response.json()
        return out

    def get(self, endpoint_id: str) -> dict[str, Any]:
        response = self.client.get(f"{URL}/{endpoint_id}", headers=self.user)
        assert response.status_code == 200, response.text
        out: dict[str, Any] = response.json()
        return out

    def chat(self, model: str = "chat", **body: Any) -> Any:
        payload = {"model": model, "messages": [{"role": "user", "content": "hi"}]} | body
        return self.client.post("/v1/chat/completions", headers=self.user, json=payload)


@pytest.fixture
def eps(clock: TestClock, make_client: Callable[..., TestClient]) -> Iterator[Endpoints]:
    setup = Endpoints(make_client(**BILLING), clock)
    yield setup
    setup.check_ledger()


def test_an_endpoint_s_replicas_are_jobs_that_serve_until_stopped_and_are_billed(eps: Endpoints) -> None:
    eps.top_up("100")
    endpoint = eps.created(replicas=2, max_model_len=512, engine_args={"dtype": "float16"})
    assert endpoint["state"] == "pending" and endpoint["url"].endswith("/v1")
    not_ready = eps.chat()
    assert not_ready.status_code == 503 and not_ready.headers["retry-after"] == "10"
    assert not_ready.json()["error"]["details"]["state"] in ("pending", "deploying")  # placed meanwhile
    first, second = (r["job_id"] for r in endpoint["replica_jobs"])
    scheduler.schedule_once(eps.ctx)
    assignments = {a["job_id"]: a for a in eps.poll()["assignments"]}
    assert set(assignments) == {first, second}
    engine = assignments[first]["engine"]
    assert engine == {
        "served_name": "chat",
        "adapter": False,
        "max_model_len": 512,
        "engine_args": {"dtype": "float16"},
        "restarts": 3,
    }
    assert [i["name"] for i in assignments[first]["inputs"]] == ["model"]
    for job_id in (first, second):
        eps.status(job_id, 1, "starting")
        eps.listed[job_id, 1] = 1
    eps.beat()
    assert eps.get(endpoint["id"])["state"] == "deploying"
    eps.status(first, 1, "running")
    assert eps.get(endpoint["id"])["state"] == "deploying"
    eps.status(second, 1, "running")
    ready = eps.get(endpoint["id"])
    assert ready["state"] == "ready" and ready["replicas_ready"] == 2
    models = eps.client.get("/v1/models", headers=eps.user).json()["data"]
    assert {"id": "chat", "kind": "endpoint", "base_model": BASE}.items() <= models[-1].items()
    # Ready, but no agent holds a tunnel here: the call is told to retry.
    unreachable = eps.chat()
    assert unreachable.status_code == 503 and unreachable.json()["error"]["code"] == "endpoint_unreachable"
    eps.tick(100)
    # An engine that gave up is a failed replica: the endpoint is degraded, not ready.
    eps.finish(second, 1, "failed", reason="engine gave up")
    degraded = eps.get(endpoint["id"])
    assert degraded["state"] == "degraded" and degraded["replicas_ready"] == 1
    assert eps.meter().charged >= 1
    stopped = eps.client.delete(f"{URL}/{endpoint['id']}", headers=eps.user).json()
    assert stopped["state"] == "stopped"
    # The failed replica's replacement (docs/endpoints.md, "Replacing a failed replica") is cancelled
    # too: a command as well where a scheduling pass on another thread (PostgreSQL) placed it.
    commands = {c["job_id"]: c for c in eps.poll(wait=0)["commands"]}
    assert first in commands and all(c["cancel"] is True for c in commands.values())
    assert second not in commands and len(commands) <= 2
    eps.finish(first, 1, "cancelled")
    eps.meter()
    assert eps.balance() < 100_000_000
    # The name is free again once the endpoint is deleted.
    assert eps.create().status_code == 201


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_fine_tuned_model_is_served_as_its_base_plus_the_adapter(eps: Endpoints) -> None:
    eps.top_up("100")
    add_model(
        eps.ctx,
        ADAPTER,
        b"an adapter" * 20,
        owner_id=eps.user_id,
        kind=ModelKind.ADAPTER,
        base_model_id=eps.base_id,
    )
    endpoint = eps.created(model=ADAPTER)
    scheduler.schedule_once(eps.ctx)
    (assignment,) = eps.poll()["assignments"]
    assert assignment["job_id"] == endpoint["replica_jobs"][0]["job_id"]
    assert assignment["engine"]["adapter"] is True
    assert [i["name"] for i in assignment["inputs"]] == ["model", "adapter"]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"model": "no-such-model"}, 404, "model"),
        ({"gpus": 65}, 422, "gpus"),
        ({"replicas": 0}, 422, "replicas"),
        ({"gpu_product": "NVIDIA-Z9"}, 422, "gpu_product"),
        ({"engine_args": {"host": "10.0.0.1"}}, 422, "engine_args"),
        ({"engine_args": {"max_num_seqs": "8"}}, 422, "engine_args"),
        ({"engine_args": {"dtype": "x; rm -rf /"}}, 422, "engine_args"),
        ({"max_model_len": 1}, 422, "max_model_len"),
        ({"name": "has space"}, 422, "name"),
        ({"surprise": 1}, 422, "surprise"),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_deploys_nothing(
    eps: Endpoints, body: dict[str, Any], status: int, field: str
) -> None:
    eps.top_up("100")
    response = eps.create(**body)
    assert response.status_code == status, response.text
    assert field in response.text
    assert eps.client.get(URL, headers=eps.user).json() == []


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_balance_that_cannot_pay_every_replica_s_first_hour_deploys_nothing(eps: Endpoints) -> None:
    eps.top_up("10")  # 7.20 CNY an hour per GPU: one replica's hour, not two
    response = eps.create(replicas=2)
    assert response.status_code == 402 and response.json()["error"]["code"] == "insufficient_balance"
    assert eps.client.get(URL, headers=eps.user).json() == []
    assert eps.create(replicas=1).status_code == 201
    taken = eps.create(replicas=1)
    assert taken.status_code == 409 and "name" in taken.text


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"model": ""}, "model"),
        ({"messages": []}, "messages"),
        ({"messages": [{"content": "no role"}]}, "messages.0.role"),
        ({"stream": "yes"}, "stream"),
        ({"max_tokens": 0}, "max_tokens"),
    ],
)
def test_a_bad_chat_body_is_refused_naming_the_field(
    eps: Endpoints, body: dict[str, Any], field: str
) -> None:
    eps.top_up("100")
    eps.created()
    response = eps.chat(**body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["details"][0]["field"] == field


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_endpoint_answers_only_its_owner(eps: Endpoints) -> None:
    eps.top_up("100")
    eps.created()
    register(eps.client, "other@example.com", "user")
    other = login(eps.client, "other@example.com")
    payload = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    assert eps.client.post("/v1/chat/completions", headers=other, json=payload).status_code == 404
    assert eps.client.post("/v1/chat/completions", json=payload).status_code == 401
    (mine,) = eps.client.get(URL, headers=eps.user).json()
    assert eps.client.get(f"{URL}/{mine['id']}", headers=other).status_code == 404
    assert eps.client.delete(f"{URL}/{mine['id']}", headers=other).status_code == 404


def test_inference_keys_are_shown_once_call_only_their_owner_s_endpoints_and_are_revocable(
    eps: Endpoints,
) -> None:
    eps.top_up("100")
    eps.created()
    made = eps.client.post("/api/v1/keys", headers=eps.user, json={"name": "script", "rpm": 2})
    assert made.status_code == 201, made.text
    secret = made.json()["key"]
    assert secret.startswith("sk-") and made.json()["prefix"] == secret[:10]
    (listed,) = eps.client.get("/api/v1/keys", headers=eps.user).json()
    assert "key" not in listed and listed["name"] == "script" and secret not in str(listed)
    key = {"Authorization": f"Bearer {secret}"}
    payload = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    # The key reaches its owner's endpoint (not serving yet: 503), within its 2 requests a minute.
    for _ in range(2):
        assert eps.client.post("/v1/chat/completions", headers=key, json=payload).status_code == 503
    over = eps.client.post("/v1/chat/completions", headers=key, json=payload)
    assert over.status_code == 429 and int(over.headers["retry-after"]) >= 1
    assert eps.client.get("/v1/models", headers=key).status_code == 200
    # A key is no user token: the rest of the API refuses it.
    assert eps.client.get(URL, headers=key).status_code == 401
    # Another user's key does not reach this endpoint.
    register(eps.client, "other@example.com", "user")
    other = login(eps.client, "other@example.com")
    theirs = eps.client.post("/api/v1/keys", headers=other, json={"name": "x"}).json()["key"]
    foreign = eps.client.post(
        "/v1/chat/completions", headers={"Authorization": f"Bearer {theirs}"}, json=payload
    )
    assert foreign.status_code == 404
    assert eps.client.delete(f"/api/v1/keys/{listed['id']}", headers=other).status_code == 404
    revoked = eps.client.delete(f"/api/v1/keys/{listed['id']}", headers=eps.user).json()
    assert revoked["revoked_at"] is not None
    gone = eps.client.post("/v1/chat/completions", headers=key, json=payload)
    assert gone.status_code == 401
    bad = eps.client.post(
        "/v1/chat/completions", headers={"Authorization": "Bearer sk-nothing"}, json=payload
    )
    assert bad.status_code == 401
    assert eps.client.post("/api/v1/keys", headers=eps.user, json={"rpm": 0}).status_code == 422
