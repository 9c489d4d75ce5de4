"""An empty balance stops work and holds the queue, through the REST API and the agent protocol
(SQLite and PostgreSQL), with the cloud's clock frozen and moved by exact amounts."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient

from sxwl.cloud.services.jobs import balance_stop
from sxwl.cloud.services.scheduling import scheduler
from tests.support.billing_api import BILLING, Money
from tests.support.clock import TestClock


@pytest.fixture
def money(clock: TestClock, make_client: Callable[..., TestClient]) -> Iterator[Money]:
    setup = Money(make_client(**BILLING), clock)
    yield setup
    setup.check_ledger()


def test_an_empty_balance_stops_the_job_after_the_grace_and_the_queue_waits_for_a_top_up(
    money: Money,
) -> None:
    money.top_up("0.72")  # 180 s of 2 GPUs at 7.20 per GPU-hour
    running = money.submit(max_runtime_s=180)
    money.tick(1)  # submitted later: at the same instant the two would go in the order of their ids
    queued = money.submit(max_runtime_s=60)  # the CPod's 2 GPUs are taken: it waits
    attempt = money.take(running["id"])
    money.status(running["id"], attempt, "running")
    low = money.client.get("/api/v1/billing/balance", headers=money.user).json()
    assert (low["burn_per_hour"], low["running_attempts"], low["low"]) == (14_400_000, 1, True)
    assert low["hours_left"] == pytest.approx(0.05)
    money.tick(170)
    money.meter()
    assert balance_stop.stop_exhausted(money.ctx) == []  # 0.04 CNY left: nothing stops
    money.tick(10)
    money.meter()
    assert money.balance() == 0
    assert balance_stop.stop_exhausted(money.ctx) == [running["id"]]
    assert balance_stop.stop_exhausted(money.ctx) == []  # asked once

    (command,) = money.poll()["commands"]
    assert (command["job_id"], command["attempt"], command["cancel"]) == (running["id"], attempt, True)
    assert (command["reason"], command["grace_s"]) == ("balance exhausted", 30.0)
    ack = money.client.post(f"/api/v1/agent/commands/{command['id']}/ack", headers=money.agent)
    assert ack.status_code == 204
    stopping = money.job(running["id"])
    assert stopping["state"] == "running"  # SIGTERM sent: the script saves its checkpoint
    money.tick(30)  # the grace, in which it still runs (and is billed)
    money.finish(running["id"], attempt, "failed", exit_code=143)
    money.meter()
    stopped = money.job(running["id"])
    assert (stopped["state"], stopped["reason"]) == ("cancelled", "balance exhausted")
    assert stopped["cost"] == 840_000 and money.balance() == -120_000

    scheduler.schedule_once(money.ctx)
    waiting = money.job(queued["id"])
    assert waiting["state"] == "queued"
    assert waiting["reason"] == "waiting for a top-up: your balance is -0.12 CNY"
    assert money.poll(wait=0)["assignments"] == []
    money.top_up("1")
    assert money.take(queued["id"]) == 1
    assert money.job(queued["id"])["state"] == "starting"


def test_a_funded_users_work_is_not_stopped(money: Money) -> None:
    money.top_up("20")
    job = money.submit(max_runtime_s=600)
    attempt = money.take(job["id"])
    money.status(job["id"], attempt, "running")
    money.tick(60)
    money.meter()
    assert balance_stop.stop_exhausted(money.ctx) == []
    assert money.poll(wait=0)["commands"] == []
