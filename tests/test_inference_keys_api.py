"""Inference keys' limits through the REST API (docs/endpoints.md, "Keys"), and OpenAI's error shape
on /v1 as the official `openai` client reads it: limits set at creation and changed, bad limits
refused naming the field with nothing changed, a monthly spend cap reached by the key's share of
what its endpoint was billed, and each /v1 refusal's `type` and `param`. The CPod's agent is driven
by hand (tests/support/billing_api.py); tests/test_endpoints_slow_head.py counts tokens per minute
from a real engine stand-in's answers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from sxwl.cloud.db.money_models import UsageLine
from sxwl.cloud.services.endpoints import routing
from sxwl.cloud.services.scheduling import scheduler
from tests.support.billing_api import BILLING
from tests.support.clock import TestClock
from tests.test_endpoints_api import Endpoints

openai = pytest.importorskip("openai")
KEYS = "/api/v1/keys"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def eps(clock: TestClock, make_client: Callable[..., TestClient]) -> Iterator[Endpoints]:
    setup = Endpoints(make_client(**BILLING), clock)
    yield setup
    setup.check_ledger()


def _key(eps: Endpoints, **body: Any) -> dict[str, Any]:
    made = eps.client.post(KEYS, headers=eps.user, json={"name": "k"} | body)
    assert made.status_code == 201, made.text
    out: dict[str, Any] = made.json()
    return out


def _client(eps: Endpoints, secret: str) -> Any:
    """The official client over the test's own HTTP client (no retries: a 503 says retry in 10 s)."""
    return openai.OpenAI(
        base_url="http://testserver/v1", api_key=secret, http_client=eps.client, max_retries=0
    )


def _listed(eps: Endpoints) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = eps.client.get(KEYS, headers=eps.user).json()
    return found


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"rpm": -1}, "rpm"),
        ({"rpm": "60"}, "rpm"),
        ({"tpm": 0}, "tpm"),
        ({"tpm": 1.5}, "tpm"),
        ({"tpm": "lots"}, "tpm"),
        ({"monthly_cap": -5}, "monthly_cap"),
        ({"monthly_cap": "abc"}, "monthly_cap"),
        ({"monthly_cap": "0.0000001"}, "monthly_cap"),
        ({"monthly_cap": True}, "monthly_cap"),
    ],
)
def test_bad_limits_are_refused_naming_the_field_and_change_nothing(
    eps: Endpoints, body: dict[str, Any], field: str
) -> None:
    made = eps.client.post(KEYS, headers=eps.user, json={"name": "k"} | body)
    assert made.status_code == 422, made.text
    assert made.json()["error"]["details"][0]["field"] == field
    assert _listed(eps) == []
    key = _key(eps, rpm=5, tpm=100, monthly_cap="12.5")
    changed = eps.client.patch(f"{KEYS}/{key['id']}", headers=eps.user, json={"rpm": 9} | body)
    assert changed.status_code == 422 and changed.json()["error"]["details"][0]["field"] == field
    (kept,) = _listed(eps)
    assert (kept["rpm"], kept["tpm"], kept["monthly_cap"]) == (5, 100, 12_500_000)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_limits_are_set_at_creation_and_changed_or_lifted(eps: Endpoints) -> None:
    key = _key(eps, rpm=60, tpm=10_000, monthly_cap="50")
    assert (key["rpm"], key["tpm"], key["monthly_cap"], key["monthly_cap_yuan"]) == (
        60,
        10_000,
        50_000_000,
        "50",
    )
    assert key["spent_this_month"] == 0
    url = f"{KEYS}/{key['id']}"
    changed = eps.client.patch(url, headers=eps.user, json={"tpm": 20_000, "monthly_cap": 7.25})
    assert changed.status_code == 200, changed.text
    assert (changed.json()["rpm"], changed.json()["tpm"], changed.json()["monthly_cap"]) == (
        60,
        20_000,
        7_250_000,
    )
    lifted = eps.client.patch(url, headers=eps.user, json={"rpm": None, "monthly_cap": None}).json()
    assert (lifted["rpm"], lifted["tpm"], lifted["monthly_cap"]) == (None, 20_000, None)
    assert eps.client.patch(url, headers=eps.user, json={"name": "x"}).status_code == 422
    assert eps.client.patch(f"{KEYS}/key-none", headers=eps.user, json={"rpm": 1}).status_code == 404
    eps.client.delete(url, headers=eps.user)
    assert eps.client.patch(url, headers=eps.user, json={"rpm": 1}).status_code == 409


def test_a_key_past_its_monthly_cap_is_refused_by_its_share_of_its_endpoint_s_cost(eps: Endpoints) -> None:
    eps.top_up("100")
    endpoint = eps.created()
    (replica,) = (r["job_id"] for r in endpoint["replica_jobs"])
    scheduler.schedule_once(eps.ctx)
    eps.poll()
    eps.status(replica, 1, "starting")
    eps.listed[replica, 1] = 1
    eps.beat()
    eps.status(replica, 1, "running")
    eps.tick(100)
    eps.meter()
    with eps.ctx.db.session() as session:
        cost = int(session.scalar(select(func.sum(UsageLine.gross)).where(UsageLine.job_id == replica)) or 0)
    assert cost > 0
    heavy, light = _key(eps, name="heavy"), _key(eps, name="light")
    # Their answers as the relay records them: three quarters of the endpoint's tokens are heavy's.
    with eps.ctx.db.session() as session:
        routing.record_usage(session, endpoint["id"], heavy["id"], 20, 10)
        routing.record_usage(session, endpoint["id"], light["id"], 5, 5)
    spent = {k["name"]: k["spent_this_month"] for k in _listed(eps)}
    assert spent == {"heavy": cost * 30 // 40, "light": cost * 10 // 40}
    cap = f"{spent['heavy'] / 1_000_000:.6f}"  # exactly what heavy has spent: reached
    eps.client.patch(f"{KEYS}/{heavy['id']}", headers=eps.user, json={"monthly_cap": cap})
    eps.client.patch(f"{KEYS}/{light['id']}", headers=eps.user, json={"monthly_cap": "100"})
    with pytest.raises(openai.RateLimitError) as over:
        _client(eps, heavy["key"]).chat.completions.create(model="chat", messages=HI)
    assert over.value.code == "monthly_cap_exceeded" and over.value.type == "rate_limit_error"
    assert "monthly spend cap" in over.value.message
    assert int(over.value.response.headers["retry-after"]) >= 1  # the next month, UTC
    # The light key is under its cap: it reaches the endpoint (no agent holds a tunnel here: 503).
    with pytest.raises(openai.InternalServerError) as unreachable:
        _client(eps, light["key"]).chat.completions.create(model="chat", messages=HI)
    assert unreachable.value.code == "endpoint_unreachable" and unreachable.value.type == "server_error"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_v1_refusals_carry_openai_s_type_and_param(eps: Endpoints) -> None:
    eps.top_up("100")
    eps.created()
    user = _client(eps, eps.user["Authorization"].removeprefix("Bearer "))
    with pytest.raises(openai.UnprocessableEntityError) as bad:
        user.chat.completions.create(model="chat", messages=[])
    assert (bad.value.type, bad.value.param) == ("invalid_request_error", "messages")
    with pytest.raises(openai.UnprocessableEntityError) as bad_role:
        user.chat.completions.create(model="chat", messages=[{"content": "no role"}])
    assert bad_role.value.param == "messages.0.role"
    with pytest.raises(openai.NotFoundError) as unknown:
        user.chat.completions.create(model="nothing-like-it", messages=HI)
    assert (unknown.value.type, unknown.value.param, unknown.value.code) == (
        "not_found_error",
        "model",
        "model_not_found",
    )
    with pytest.raises(openai.InternalServerError) as not_ready:
        user.chat.completions.create(model="chat", messages=HI)
    assert (not_ready.value.status_code, not_ready.value.type, not_ready.value.code) == (
        503,
        "server_error",
        "endpoint_not_ready",
    )
    assert not_ready.value.response.headers["retry-after"] == "10"
    with pytest.raises(openai.AuthenticationError) as bad_key:
        _client(eps, "sk-nothing").chat.completions.create(model="chat", messages=HI)
    assert bad_key.value.type == "authentication_error"
    limited = _key(eps, rpm=1)
    with pytest.raises(openai.InternalServerError):
        _client(eps, limited["key"]).chat.completions.create(model="chat", messages=HI)
    with pytest.raises(openai.RateLimitError) as over:
        _client(eps, limited["key"]).chat.completions.create(model="chat", messages=HI)
    assert (over.value.type, over.value.code) == ("rate_limit_error", "rpm_exceeded")
    # The fine-tuning routes' own validation, and a path /v1 does not have.
    with pytest.raises(openai.UnprocessableEntityError) as no_file:
        user.fine_tuning.jobs.create(model="tiny-llama", training_file="")
    assert no_file.value.param == "training_file" and no_file.value.type == "invalid_request_error"
    with pytest.raises(openai.NotFoundError) as missing:
        user.files.retrieve("file-nothing")
    assert missing.value.type == "not_found_error"
    nowhere = eps.client.get("/v1/nowhere", headers=eps.user)
    assert nowhere.status_code == 404
    assert {"type": "not_found_error", "param": None}.items() <= nowhere.json()["error"].items()
    # Outside /v1 the contract's shape stays as it was.
    assert "type" not in eps.client.get("/api/v1/nowhere", headers=eps.user).json()["error"]
