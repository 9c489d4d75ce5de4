"""The money path driven through the REST API: an admin who prices and tops up, a provider whose CPod
is driven by hand over the agent protocol (register, heartbeat, long-poll, status), a compute user,
and the cloud's clock frozen and moved by exact amounts (tests/support/clock.py)."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import func, select

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.money_models import LedgerTransaction
from sxwl.cloud.services.money import ledger, metering
from sxwl.cloud.services.scheduling import scheduler
from tests.conftest import login, register
from tests.support.clock import TestClock
from tests.support.cpods import A100, access_key, beat, gpu_node, register_cpod
from tests.test_admin_api import make_admin
from tests.test_cpods_api import ctx_of

PRODUCT = str(A100["product"])
# Settings of every money test: billing on, and the background metering loop left to its first
# round at start-up, so that each test rates exactly when it says (meter_once with the clock's now).
BILLING = {"billing_enabled": True, "metering_interval_s": 3600.0, "balance_stop_grace_s": 30.0}
HEARTBEAT_S = 10.0  # the interval the cloud tells agents (Settings.heartbeat_interval_s)


class Money:
    def __init__(
        self, client: TestClient, clock: TestClock, gpus: int = 2, price: str | None = "7.20"
    ) -> None:
        self.client, self.clock = client, clock
        self.ctx: CloudContext = ctx_of(client)
        self.admin = make_admin(client)
        self.provider_id: str = register(client, "owner@example.com", "provider")["id"]
        self.provider = login(client, "owner@example.com")
        reg = register_cpod(client, access_key(client, self.provider))
        self.cpod_id: str = reg["cpod_id"]
        self.agent = {"Authorization": f"Bearer {reg['cpod_token']}"}
        self.token: str = reg["cpod_token"]
        self.gpus, self.used, self.seq = gpus, 0, 0
        # The attempts this CPod's heartbeats list, and the GPUs each holds.
        self.listed: dict[tuple[str, int], int] = {}
        self.beat()
        self.user_id: str = register(client, "dev@example.com", "user")["id"]
        self.user = login(client, "dev@example.com")
        if price is not None:
            self.price(price, "10")

    # ---- admin ----------------------------------------------------------------------------------

    def price(self, price: str, fee: str, product: str = PRODUCT) -> list[dict[str, Any]]:
        body = {"prices": [{"product": product, "price_per_hour_yuan": price, "fee_percent": fee}]}
        response = self.client.put("/api/v1/admin/prices", headers=self.admin, json=body)
        assert response.status_code == 200, response.text
        listing: list[dict[str, Any]] = response.json()
        return listing

    def top_up(self, amount: str, user_id: str | None = None) -> dict[str, Any]:
        response = self.client.post(
            "/api/v1/admin/top-ups",
            headers=self.admin,
            json={"user_id": user_id or self.user_id, "amount_yuan": amount, "note": "test"},
        )
        assert response.status_code == 201, response.text
        tx: dict[str, Any] = response.json()
        return tx

    # ---- the user -------------------------------------------------------------------------------

    def submit(self, **body: Any) -> dict[str, Any]:
        response = self.try_submit(**body)
        assert response.status_code == 201, response.text
        job: dict[str, Any] = response.json()
        return job

    def try_submit(self, **body: Any) -> Any:
        payload = {"name": "t", "command": ["python", "train.py"], "gpu_product": PRODUCT, "gpus_per_node": 2}
        return self.client.post("/api/v1/jobs", headers=self.user, json=payload | body)

    def job(self, job_id: str) -> dict[str, Any]:
        response = self.client.get(f"/api/v1/jobs/{job_id}", headers=self.user)
        assert response.status_code == 200, response.text
        job: dict[str, Any] = response.json()
        return job

    def balance(self) -> int:
        value: int = self.client.get("/api/v1/billing/balance", headers=self.user).json()["balance"]
        return value

    # ---- the agent ------------------------------------------------------------------------------

    def beat(self) -> None:
        self.seq += 1
        jobs = [{"job_id": job_id, "attempt": attempt, "state": "running"} for job_id, attempt in self.listed]
        node = gpu_node("w1", count=self.gpus, used=self.used + sum(self.listed.values()))
        response = beat(self.client, self.token, self.seq, [node], jobs=jobs)
        assert response.status_code == 200 and response.json()["accepted"], response.text

    def tick(self, seconds: float) -> None:
        """Lets ``seconds`` pass as a live agent would: a heartbeat at least every interval, so the
        liveness loop never finds this CPod silent; the last one at the end."""
        while seconds > 0:
            step = min(seconds, HEARTBEAT_S / 2)
            self.clock.advance(step)
            seconds -= step
            self.beat()

    def poll(self, wait: float = 5) -> dict[str, Any]:
        response = self.client.get(f"/api/v1/agent/assignments?wait={wait}", headers=self.agent)
        assert response.status_code == 200, response.text
        reply: dict[str, Any] = response.json()
        return reply

    def status(self, job_id: str, attempt: int, state: str, **extra: Any) -> None:
        response = self.client.post(
            f"/api/v1/agent/jobs/{job_id}/status",
            headers=self.agent,
            json={"attempt": attempt, "state": state, **extra},
        )
        assert response.status_code == 200, response.text

    def take(self, job_id: str) -> int:
        """Long-polls until the job is assigned here; reports it starting (listed from then on)."""
        scheduler.schedule_once(self.ctx)
        (assignment,) = [a for a in self.poll()["assignments"] if a["job_id"] == job_id]
        attempt: int = assignment["attempt"]
        self.status(job_id, attempt, "starting")
        self.listed[job_id, attempt] = assignment["gpus_per_node"]
        self.beat()
        return attempt

    def nothing_assigned(self) -> None:
        scheduler.schedule_once(self.ctx)
        assert self.poll(wait=0)["assignments"] == []

    def finish(self, job_id: str, attempt: int, state: str = "succeeded", **extra: Any) -> None:
        self.status(job_id, attempt, state, **extra)
        del self.listed[job_id, attempt]
        self.beat()

    # ---- the ledger -----------------------------------------------------------------------------

    def meter(self) -> metering.PassResult:
        return metering.meter_once(self.ctx, now=self.clock.now)

    def account(self, kind: str, owner_id: str | None = None) -> int:
        with self.ctx.db.session() as session:
            return ledger.balance(session, ledger.account_key(kind, owner_id))

    def transactions(self) -> int:
        with self.ctx.db.session() as session:
            return session.scalar(select(func.count()).select_from(LedgerTransaction)) or 0

    def check_ledger(self) -> None:
        with self.ctx.db.session() as session:
            report = ledger.check(session)
        assert report.ok, report
