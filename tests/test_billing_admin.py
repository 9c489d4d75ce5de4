"""Money that admins move, through the REST API (SQLite and PostgreSQL): earnings released after the
hold and paid out, who may move money and read whose ledger, and bad input that changes nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from sxwl.cloud.db.money_models import LedgerTransaction, PriceChange
from sxwl.cloud.services.money import earnings, ledger
from tests.conftest import login, register
from tests.support.billing_api import BILLING, PRODUCT, Money
from tests.support.clock import TestClock

HOLD_S = 3 * 24 * 3600.0
NET = 325_800  # what 90.5 s of 2 GPUs at 7.20 per GPU-hour earns at a 10 % fee


@pytest.fixture
def money(clock: TestClock, make_client: Callable[..., TestClient]) -> Iterator[Money]:
    setup = Money(make_client(**BILLING, earnings_hold_s=HOLD_S), clock)
    yield setup
    setup.check_ledger()


def run_90_5_seconds(money: Money) -> str:
    money.top_up("20")
    job = money.submit()
    attempt = money.take(job["id"])
    money.status(job["id"], attempt, "running")
    money.tick(90)
    money.clock.advance(0.5)
    money.finish(job["id"], attempt)
    money.meter()
    job_id: str = job["id"]
    return job_id


def payout(money: Money, amount: str, key: str | None = None, **extra: Any) -> Any:
    body = {"provider_id": money.provider_id, "amount_yuan": amount, "reference": "bank 0001"} | extra
    if key:
        body["idempotency_key"] = key
    return money.client.post("/api/v1/admin/payouts", headers=money.admin, json=body)


def test_earnings_become_available_after_the_hold_and_are_paid_out(money: Money) -> None:
    run_90_5_seconds(money)
    earned_at = money.clock.now
    assert earnings.release_once(money.ctx, earned_at + timedelta(seconds=HOLD_S - 1)) == 0
    refused = payout(money, "0.01")
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["details"][0]["field"] == "amount_yuan"

    assert earnings.release_once(money.ctx, earned_at + timedelta(seconds=HOLD_S)) == 1
    assert earnings.release_once(money.ctx, earned_at + timedelta(seconds=HOLD_S + 60)) == 0
    mine = money.client.get("/api/v1/earnings", headers=money.provider).json()
    assert (mine["pending"], mine["available"], mine["paid_out"]) == (0, NET, 0)

    before = money.transactions()
    above = payout(money, "0.325801")
    assert above.status_code == 422, above.text
    assert above.json()["error"]["details"][0]["field"] == "amount_yuan"
    assert "0.33 CNY available" in above.json()["error"]["message"]
    assert money.transactions() == before
    assert money.account(ledger.PROVIDER_AVAILABLE, money.provider_id) == NET

    paid = payout(money, "0.3258", key="transfer-1")
    assert paid.status_code == 201, paid.text
    tx = paid.json()
    assert (tx["kind"], tx["amount"], tx["note"], tx["actor"]) == (
        "payout",
        NET,
        "bank 0001",
        "root@example.com",
    )
    again = payout(money, "0.3258", key="transfer-1")
    assert again.status_code == 201 and again.json()["id"] == tx["id"]
    assert payout(money, "0.1", key="transfer-1").status_code == 409
    assert payout(money, "0.000001").status_code == 422  # nothing left
    mine = money.client.get("/api/v1/earnings", headers=money.provider).json()
    assert (mine["pending"], mine["available"], mine["paid_out"]) == (0, 0, NET)
    revenue = money.client.get("/api/v1/admin/revenue", headers=money.admin).json()
    assert revenue == {
        "fees": 362_000 - NET,
        "top_ups": 20_000_000,
        "payouts": NET,
        "providers_pending": 0,
        "providers_available": 0,
        "users_cash": 20_000_000 - 362_000,
    }


ADMIN_CALLS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "/api/v1/admin/prices", None),
    (
        "PUT",
        "/api/v1/admin/prices",
        {"prices": [{"product": PRODUCT, "price_per_hour_yuan": "0", "fee_percent": "0"}]},
    ),
    ("POST", "/api/v1/admin/top-ups", {"user_id": "", "amount_yuan": "1000"}),
    ("POST", "/api/v1/admin/payouts", {"provider_id": "", "amount_yuan": "1", "reference": "x"}),
    ("GET", "/api/v1/admin/revenue", None),
]


def test_moving_money_needs_an_admin_and_is_recorded_with_who_and_when(money: Money) -> None:
    before = money.transactions()
    for headers in (money.user, money.provider):
        for method, path, body in ADMIN_CALLS:
            if body is not None and "user_id" in body:
                body = body | {"user_id": money.user_id}
            if body is not None and "provider_id" in body:
                body = body | {"provider_id": money.provider_id}
            response = money.client.request(method, path, headers=headers, json=body)
            assert response.status_code == 403, (method, path, response.text)
    assert money.transactions() == before
    (price,) = money.client.get("/api/v1/admin/prices", headers=money.admin).json()
    assert (price["price_per_hour"], price["fee_percent"]) == (7_200_000, "10")

    money.clock.advance(60)
    changed_at = money.clock.now
    (price,) = money.price("8", "12.5")
    assert (price["updated_by"], price["fee_percent"]) == ("root@example.com", "12.5")
    assert price["updated_at"].startswith(changed_at.strftime("%Y-%m-%dT%H:%M:%S"))
    money.clock.advance(60)
    tx = money.top_up("3")
    assert (tx["actor"], tx["amount"], tx["user_id"]) == ("root@example.com", 3_000_000, money.user_id)
    assert tx["created_at"].startswith(money.clock.now.strftime("%Y-%m-%dT%H:%M:%S"))
    with money.ctx.db.session() as session:
        changes = session.scalars(select(PriceChange).order_by(PriceChange.id)).all()
        assert [(c.price_per_hour, c.fee_bp, c.at) for c in changes] == [
            (7_200_000, 1000, changes[0].at),
            (8_000_000, 1250, changed_at),
        ]
        assert {c.actor_id for c in changes} == {session.scalar(select(LedgerTransaction.actor_id))}


def test_users_and_providers_read_only_their_own_money(money: Money) -> None:
    job_id = run_90_5_seconds(money)
    register(money.client, "other@example.com", "user")
    other = login(money.client, "other@example.com")
    register(money.client, "rival@example.com", "provider")
    rival = login(money.client, "rival@example.com")

    assert money.client.get("/api/v1/billing/statement", headers=money.user).json()["total"] == 362_000
    theirs = money.client.get("/api/v1/billing/statement", headers=other).json()
    assert theirs["lines"] == [] and theirs["top_ups"] == [] and theirs["total"] == 0
    assert money.client.get("/api/v1/billing/balance", headers=other).json()["balance"] == 0
    assert money.client.get(f"/api/v1/jobs/{job_id}", headers=other).status_code in (403, 404)
    assert money.client.get("/api/v1/earnings", headers=money.user).status_code == 403
    rivals = money.client.get("/api/v1/earnings", headers=rival).json()
    assert (rivals["pending"], rivals["month_net"], rivals["lines"]) == (0, 0, [])
    csv_text = money.client.get("/api/v1/earnings?format=csv", headers=rival).text
    assert job_id not in csv_text and csv_text.startswith("job,")


BAD_PRICES = [
    ({"price_per_hour_yuan": "-1"}, "price_per_hour_yuan"),
    ({"price_per_hour_yuan": "abc"}, "price_per_hour_yuan"),
    ({"price_per_hour_yuan": "NaN"}, "price_per_hour_yuan"),
    ({"price_per_hour_yuan": "Infinity"}, "price_per_hour_yuan"),
    ({"price_per_hour_yuan": True}, "price_per_hour_yuan"),
    ({"price_per_hour_yuan": "7.1234567"}, "price_per_hour_yuan"),
    ({"price_per_hour_yuan": "100000.01"}, "price_per_hour_yuan"),
    ({"price_per_hour_yuan": "1_000"}, "price_per_hour_yuan"),
    ({"price_per_hour_yuan": "1e-999999999999"}, "price_per_hour_yuan"),  # not a price of 0
    ({"fee_percent": "101"}, "fee_percent"),
    ({"fee_percent": "-1"}, "fee_percent"),
    ({"fee_percent": "ten"}, "fee_percent"),
    ({"fee_percent": "10.001"}, "fee_percent"),
    ({"product": ""}, "product"),
]


@pytest.mark.parametrize(("change", "field"), BAD_PRICES)
def test_bad_prices_are_422_naming_the_field_and_change_nothing(
    money: Money, change: dict[str, Any], field: str
) -> None:
    item = {"product": "NVIDIA-H100", "price_per_hour_yuan": "20", "fee_percent": "10"} | change
    body = {"prices": [{"product": PRODUCT, "price_per_hour_yuan": "1", "fee_percent": "1"}, item]}
    response = money.client.put("/api/v1/admin/prices", headers=money.admin, json=body)
    assert response.status_code == 422, response.text
    assert any(d["field"].endswith(field) for d in response.json()["error"]["details"]), response.text
    (price,) = money.client.get("/api/v1/admin/prices", headers=money.admin).json()
    assert (price["product"], price["price_per_hour"], price["fee_percent"]) == (PRODUCT, 7_200_000, "10")
    with money.ctx.db.session() as session:
        assert len(session.scalars(select(PriceChange)).all()) == 1


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"amount_yuan": "0"}, "amount_yuan"),
        ({"amount_yuan": "-5"}, "amount_yuan"),
        ({"amount_yuan": "100000001"}, "amount_yuan"),
        ({"amount_yuan": "1e30"}, "amount_yuan"),
        ({"amount_yuan": "abc"}, "amount_yuan"),
        ({"amount_yuan": "１０"}, "amount_yuan"),
        ({"amount_yuan": "0.0000001"}, "amount_yuan"),
        ({"user_id": "nobody"}, "user_id"),
        ({"user_id": "provider"}, "user_id"),
        ({"note": "x" * 501}, "note"),
    ],
)
def test_bad_top_ups_are_422_naming_the_field_and_change_nothing(
    money: Money, change: dict[str, Any], field: str
) -> None:
    money.top_up("5")
    before = money.transactions()
    body = {"user_id": money.user_id, "amount_yuan": "10", "note": "card"} | change
    if body["user_id"] == "provider":
        body["user_id"] = money.provider_id
    response = money.client.post("/api/v1/admin/top-ups", headers=money.admin, json=body)
    assert response.status_code == 422, response.text
    assert [d["field"] for d in response.json()["error"]["details"]] == [field]
    assert money.transactions() == before and money.balance() == 5_000_000


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"amount_yuan": "0"}, "amount_yuan"),
        ({"amount_yuan": "-1"}, "amount_yuan"),
        ({"provider_id": "nobody"}, "provider_id"),
        ({"provider_id": "user"}, "provider_id"),
        ({"reference": ""}, "reference"),
    ],
)
def test_bad_payouts_are_422_naming_the_field_and_change_nothing(
    money: Money, change: dict[str, Any], field: str
) -> None:
    run_90_5_seconds(money)
    earnings.release_once(money.ctx, money.clock.now + timedelta(seconds=HOLD_S))
    before = money.transactions()
    body = {"provider_id": money.provider_id, "amount_yuan": "0.1", "reference": "bank 0002"} | change
    if body["provider_id"] == "user":
        body["provider_id"] = money.user_id
    response = money.client.post("/api/v1/admin/payouts", headers=money.admin, json=body)
    assert response.status_code == 422, response.text
    assert [d["field"] for d in response.json()["error"]["details"]] == [field]
    assert money.transactions() == before
    assert money.account(ledger.PROVIDER_AVAILABLE, money.provider_id) == NET


@pytest.mark.parametrize("month", ["２０２６-03", "2026-3", "2026-13", "9999-12", "0000-01"])
@pytest.mark.parametrize("path", ["/api/v1/billing/statement", "/api/v1/earnings"])
def test_bad_months_are_422_naming_the_field(money: Money, path: str, month: str) -> None:
    headers = money.provider if path.endswith("earnings") else money.user
    for form in ("json", "csv"):
        response = money.client.get(path, params={"month": month, "format": form}, headers=headers)
        assert response.status_code == 422, response.text
        assert [d["field"] for d in response.json()["error"]["details"]] == ["month"]
