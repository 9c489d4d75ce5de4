"""Money through the REST API on SQLite and PostgreSQL: what a job costs to the micro-yuan, what its
provider earns, and what is never billed (queue time, time nobody can prove, a later price), with
the cloud's clock frozen and moved by exact amounts. The ledger check passes after every test."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterator

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from sxwl.cloud.db.models import JobAttempt
from sxwl.cloud.db.money_models import LedgerTransaction, UsageLine
from sxwl.cloud.services.fleet import cpods
from sxwl.cloud.services.money import ledger
from sxwl.protocol.money import provider_share
from tests.support.billing_api import BILLING, PRODUCT, Money
from tests.support.clock import TestClock

FEE_BP = 1000  # the 10 % every Money setup prices at


@pytest.fixture
def money(clock: TestClock, make_client: Callable[..., TestClient]) -> Iterator[Money]:
    setup = Money(make_client(**BILLING), clock)
    yield setup
    setup.check_ledger()


def test_90_5_seconds_on_2_gpus_cost_exactly_0_362_and_queue_time_is_free(money: Money) -> None:
    money.top_up("20")
    money.used = 2  # the CPod's GPUs are busy with other work: the job waits in the queue
    money.beat()
    job = money.submit()
    money.tick(120)
    assert money.job(job["id"])["state"] == "queued"
    money.used = 0
    money.beat()
    attempt = money.take(job["id"])
    money.tick(45)  # assigned, then pulling its image: still free
    assert money.meter().charged == 0 and money.job(job["id"])["cost"] == 0

    money.status(job["id"], attempt, "running")
    money.tick(30)
    assert money.job(job["id"])["cost"] == 120_000  # live, before any rating
    assert money.meter().charged == 120_000  # 30 s × 2 GPUs at 7.20 per GPU-hour
    assert money.job(job["id"])["cost_per_hour"] == 14_400_000
    money.tick(60)
    money.clock.advance(0.5)
    money.finish(job["id"], attempt)
    money.tick(600)  # time after the end is not billed either
    money.meter()
    assert money.meter().rated == 0  # rated to its end: nothing left to rate

    gross = 362_000
    net = provider_share(gross, FEE_BP)
    assert net == 325_800
    done = money.job(job["id"])
    assert done["state"] == "succeeded" and done["cost"] == gross and done["cost_per_hour"] == 0
    assert money.balance() == 20_000_000 - gross
    assert money.account(ledger.USER_CASH, money.user_id) == 20_000_000 - gross
    assert money.account(ledger.PROVIDER_PENDING, money.provider_id) == net
    assert money.account(ledger.PROVIDER_AVAILABLE, money.provider_id) == 0
    assert money.account(ledger.PLATFORM_FEES) == gross - net
    with money.ctx.db.session() as session:
        usage = session.scalars(select(LedgerTransaction).where(LedgerTransaction.kind == "usage")).all()
        lines = session.scalars(select(UsageLine).order_by(UsageLine.from_us)).all()
        placed = session.get(JobAttempt, (job["id"], attempt))
        assert placed is not None and placed.rated_done
        assert (placed.rated_us, placed.charged, placed.earned) == (90_500_000, gross, net)
    assert len(usage) == 2  # the pass while it ran, the pass after it ended
    assert sum(t.gross for t in usage) == gross and sum(t.net for t in usage) == net
    # One line per slice, each in its pass's transaction, one following the other.
    assert [(line.from_us, line.to_us) for line in lines] == [(0, 30_000_000), (30_000_000, 90_500_000)]
    assert [line.transaction_id for line in lines] == [
        t.id for t in sorted(usage, key=lambda t: t.created_at)
    ]
    assert [line.gross for line in lines] == [t.gross for t in sorted(usage, key=lambda t: t.created_at)]

    statement = money.client.get("/api/v1/billing/statement", headers=money.user).json()
    assert statement["month"] == "2026-03" and statement["total"] == gross
    assert statement["total_yuan"] == "0.362"
    (line,) = statement["lines"]
    # What the user paid, and nothing of the provider's: no CPod id, no fee and net split.
    assert line == {
        "job_id": job["id"],
        "job_name": "t",
        "attempt": attempt,
        "resource": "gpu",
        "gpu_product": PRODUCT,
        "units": 2,
        "usage_us": 90_500_000,
        "unit_seconds": 181.0,
        "unit_price": 7_200_000,
        "gross": gross,
    }
    (top_up,) = statement["top_ups"]
    assert top_up["amount"] == 20_000_000 and top_up["actor"] == "root@example.com"

    rows = _csv(money.client.get("/api/v1/billing/statement?month=2026-03&format=csv", headers=money.user))
    paid = {
        "job": job["id"],
        "job_name": "t",
        "attempt": str(attempt),
        "gpu_product": PRODUCT,
        "gpu_seconds": "181.000000",
        "unit_price_per_hour": "7.200000",
        "gross": "0.362000",
    }
    assert rows == [paid]
    other_month = money.client.get("/api/v1/billing/statement?month=2026-02", headers=money.user).json()
    assert other_month["lines"] == [] and other_month["total"] == 0

    earned = money.client.get("/api/v1/earnings", headers=money.provider).json()
    assert (earned["pending"], earned["available"], earned["paid_out"]) == (net, 0, 0)
    assert (earned["today"], earned["month_net"]) == (net, net)
    assert (earned["month_gross"], earned["month_fee"]) == (gross, gross - net)
    assert earned["sold_gpu_hours"] == pytest.approx(181 / 3600)
    assert [(b["key"], b["net"]) for b in earned["by_cpod"]] == [(money.cpod_id, net)]
    assert [(b["key"], b["unit_seconds"]) for b in earned["by_product"]] == [(PRODUCT, 181.0)]
    (earned_line,) = earned["lines"]
    split_out = (earned_line["cpod_id"], earned_line["fee"], earned_line["net"])
    assert split_out == (money.cpod_id, gross - net, net)
    assert {k: v for k, v in earned_line.items() if k in line} == line
    split = {"cpod": money.cpod_id, "fee": "0.036200", "net": "0.325800"}
    assert _csv(money.client.get("/api/v1/earnings?format=csv", headers=money.provider)) == [paid | split]


def test_a_price_change_mid_run_keeps_the_running_attempts_price(money: Money) -> None:
    money.top_up("20")
    job = money.submit()
    attempt = money.take(job["id"])
    money.status(job["id"], attempt, "running")
    money.tick(30)
    money.meter()
    money.price("14.40", "25")
    money.tick(60.5)
    money.finish(job["id"], attempt)
    money.meter()
    assert money.job(job["id"])["cost"] == 362_000
    assert money.account(ledger.PROVIDER_PENDING, money.provider_id) == provider_share(362_000, FEE_BP)

    types = money.client.get("/api/v1/gpu-types", headers=money.user).json()
    assert [(t["product"], t["price_per_hour"]) for t in types] == [(PRODUCT, 14_400_000)]
    later = money.submit(max_runtime_s=600)
    later_attempt = money.take(later["id"])
    money.status(later["id"], later_attempt, "running")
    assert money.job(later["id"])["cost_per_hour"] == 2 * 14_400_000  # the new price from now on
    money.tick(10)
    money.finish(later["id"], later_attempt)
    money.meter()
    assert money.job(later["id"])["cost"] == 80_000
    assert money.account(ledger.PROVIDER_PENDING, money.provider_id) == provider_share(
        362_000, FEE_BP
    ) + provider_share(80_000, 2500)


def test_a_lost_cpod_is_paid_up_to_its_last_heartbeat_listing_the_attempt(money: Money) -> None:
    money.top_up("20")
    job = money.submit()
    attempt = money.take(job["id"])
    money.status(job["id"], attempt, "running")
    money.tick(40)  # the last heartbeat listing the attempt comes 40 s after it started
    money.clock.advance(35)  # the CPod falls silent
    assert money.meter().charged == 160_000  # 40 s × 2 GPUs: nothing after the last proof
    money.clock.advance(60)
    # The app's own liveness loop reads the same clock, so it may make either move first.
    cpods.sweep_liveness(money.ctx, money.clock.now)
    cpods.sweep_liveness(money.ctx, money.clock.now)
    (cpod,) = money.client.get("/api/v1/cpods", headers=money.provider).json()
    assert cpod["status"] == "offline"
    requeued = money.job(job["id"])
    assert requeued["state"] == "queued" and requeued["attempt"] == attempt
    money.clock.advance(3600)
    money.meter()
    assert money.job(job["id"])["cost"] == 160_000
    assert money.balance() == 20_000_000 - 160_000
    assert money.account(ledger.PROVIDER_PENDING, money.provider_id) == provider_share(160_000, FEE_BP)


def test_an_attempt_its_cpod_stops_listing_is_paid_up_to_the_last_listing(money: Money) -> None:
    money.top_up("20")
    job = money.submit()
    attempt = money.take(job["id"])
    money.status(job["id"], attempt, "running")
    money.tick(20)
    money.listed.clear()  # the CPod still answers, but no longer holds the attempt
    money.tick(30)
    money.meter()
    assert money.job(job["id"])["cost"] == 80_000  # 20 s × 2 GPUs


def test_cpu_only_work_has_its_own_price_per_core_hour(money: Money) -> None:
    body = {"prices": [{"resource": "cpu", "price_per_hour_yuan": "0.36", "fee_percent": "0"}]}
    assert money.client.put("/api/v1/admin/prices", headers=money.admin, json=body).status_code == 200
    money.top_up("1")
    job = money.submit(gpus_per_node=0, gpu_product=None, max_runtime_s=600)
    attempt = money.take(job["id"])
    money.status(job["id"], attempt, "running")
    money.tick(100)
    money.finish(job["id"], attempt)
    money.meter()
    assert money.job(job["id"])["cost"] == 10_000  # 100 s of one core at 0.36 per core-hour
    assert money.account(ledger.PROVIDER_PENDING, money.provider_id) == 10_000  # no fee
    (line,) = money.client.get("/api/v1/billing/statement", headers=money.user).json()["lines"]
    assert (line["resource"], line["gpu_product"], line["unit_seconds"]) == ("cpu", None, 100.0)


def test_no_price_no_placement_and_gpu_types_show_the_price(money: Money) -> None:
    response = money.client.put("/api/v1/admin/prices", headers=money.admin, json={"remove": [PRODUCT]})
    assert response.status_code == 200 and response.json() == [], response.text
    nothing = money.client.put("/api/v1/admin/prices", headers=money.admin, json={})
    assert nothing.status_code == 422 and nothing.json()["error"]["details"][0]["field"] == "prices"
    types = money.client.get("/api/v1/gpu-types", headers=money.user).json()
    assert [(t["product"], t["price_per_hour"]) for t in types] == [(PRODUCT, None)]
    money.top_up("20")
    job = money.submit()
    money.nothing_assigned()
    waiting = money.job(job["id"])
    assert waiting["state"] == "queued"
    assert waiting["reason"] == f"no price is set for {PRODUCT} yet: an administrator must set one"
    money.price("7.20", "10")
    assert money.take(job["id"]) == 1
    types = money.client.get("/api/v1/gpu-types", headers=money.user).json()
    assert [(t["product"], t["price_per_hour"]) for t in types] == [(PRODUCT, 7_200_000)]


def test_a_submission_needs_a_balance_covering_its_first_hour(money: Money) -> None:
    empty = money.try_submit()
    assert empty.status_code == 402, empty.text
    assert empty.json()["error"]["details"] == {"balance": 0, "required": 14_400_000, "missing": 14_400_000}
    money.top_up("1")
    short = money.try_submit()
    assert short.status_code == 402 and short.json()["error"]["details"]["missing"] == 13_400_000
    brief = money.try_submit(max_runtime_s=600)  # a job of at most 10 minutes needs 10 minutes
    assert brief.status_code == 402 and brief.json()["error"]["details"]["missing"] == 1_400_000
    assert money.client.get("/api/v1/jobs", headers=money.user).json()["total"] == 0
    money.top_up("1.4")
    assert money.try_submit(max_runtime_s=600).status_code == 201


def test_a_balance_of_exactly_zero_cannot_submit(money: Money) -> None:
    money.top_up("0.04")
    job = money.submit(max_runtime_s=10)
    attempt = money.take(job["id"])
    money.status(job["id"], attempt, "running")
    money.tick(10)
    money.finish(job["id"], attempt)
    money.meter()
    assert money.balance() == 0
    free = money.try_submit(gpus_per_node=0, gpu_product=None)  # even work that costs nothing
    assert free.status_code == 402, free.text
    assert free.json()["error"]["details"]["missing"] == 1


def test_statements_never_hand_a_spreadsheet_a_formula(money: Money) -> None:
    money.top_up("20")
    job = money.submit(name='=HYPERLINK("http://evil.example","x")', max_runtime_s=600)
    attempt = money.take(job["id"])
    money.status(job["id"], attempt, "running")
    money.tick(5)
    money.finish(job["id"], attempt)
    money.meter()
    (mine,) = _csv(money.client.get("/api/v1/billing/statement?format=csv", headers=money.user))
    (theirs,) = _csv(money.client.get("/api/v1/earnings?format=csv", headers=money.provider))
    assert mine["job_name"] == theirs["job_name"] == "'" + job["name"]
    assert mine["gross"] == "0.020000"


def _csv(response: httpx.Response) -> list[dict[str, str]]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/csv")
    return list(csv.DictReader(io.StringIO(response.text)))


def test_a_start_whose_command_never_ran_costs_nothing(money: Money) -> None:
    """The agent said ``running`` (the sandbox was up), then that the command was not found: nothing
    is charged, no statement line, though a metering pass fell in between; a command that did run
    for as short a time is charged."""
    money.top_up("20")
    job = money.submit()
    attempt = money.take(job["id"])
    money.status(job["id"], attempt, "running")
    money.tick(2)
    assert money.meter().charged == 0  # the first slice waits until the command surely runs
    money.finish(
        job["id"], attempt, "failed", exit_code=127, reason="command not found: python", never_ran=True
    )
    money.tick(60)
    money.meter()
    assert money.job(job["id"])["cost"] == 0
    assert money.client.get("/api/v1/billing/statement", headers=money.user).json()["lines"] == []
    assert money.balance() == 20_000_000

    ran = money.submit()
    attempt = money.take(ran["id"])
    money.status(ran["id"], attempt, "running")
    money.tick(2)
    money.meter()
    money.finish(ran["id"], attempt, "failed", exit_code=1)
    money.meter()
    assert money.job(ran["id"])["cost"] == 8_000  # 2 s × 2 GPUs at 7.20 per GPU-hour
    (line,) = money.client.get("/api/v1/billing/statement", headers=money.user).json()["lines"]
    assert (line["job_id"], line["usage_us"], line["gross"]) == (ran["id"], 2_000_000, 8_000)


def test_earnings_add_up_usage_exactly(money: Money) -> None:
    """0.1 s and 0.2 s of 2 GPUs are 0.6 GPU-seconds, not the floats' 0.6000000000000001."""
    money.top_up("20")
    for seconds in (0.1, 0.2):
        job = money.submit()
        attempt = money.take(job["id"])
        money.status(job["id"], attempt, "running")
        money.clock.advance(seconds)
        money.finish(job["id"], attempt)
    money.meter()
    earned = money.client.get("/api/v1/earnings", headers=money.provider).json()
    assert [(b["key"], b["unit_seconds"]) for b in earned["by_product"]] == [(PRODUCT, 0.6)]
    assert [b["unit_seconds"] for b in earned["by_cpod"]] == [0.6]
    assert earned["sold_gpu_hours"] == 0.6 / 3600
