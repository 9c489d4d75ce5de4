"""A metering pass over more attempts than one batch holds rates them all, each batch in its own
transaction, and every attempt exactly to its proven end (SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import insert, select

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db import migrate
from sxwl.cloud.db.models import CPod, CPodStatus, Job, JobAttempt, Role, User
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services import ledger, metering
from sxwl.protocol.money import cost, provider_share
from tests.conftest import MakeSettings

PRICE = 7_200_000  # 7.20 CNY per GPU-hour
FEE_BP = 1_250  # 12.5 %


def test_a_pass_rates_every_batch_once(make_settings: MakeSettings) -> None:
    ctx = CloudContext.from_settings(make_settings(billing_enabled=True))
    migrate.upgrade(ctx.db.engine)
    t0 = utcnow() - timedelta(hours=1)
    with ctx.db.session() as session:
        session.execute(
            insert(User),
            [
                {"id": "p" * 32, "email": "p@example.com", "password_hash": "x", "role": Role.PROVIDER},
                {"id": "u" * 32, "email": "u@example.com", "password_hash": "x", "role": Role.USER},
            ],
        )
        session.execute(
            insert(CPod).values(
                id="c" * 32,
                owner_id="p" * 32,
                name="c",
                cluster_uid="c",
                runtime="local",
                agent_version="t",
                status=CPodStatus.ONLINE,
                heartbeat_interval_s=10.0,
                nodes=[],
                reported_jobs=[],
            )
        )
        ids = [f"j{i:031d}" for i in range(7)]
        session.execute(
            insert(Job),
            [
                {
                    "id": i,
                    "owner_id": "u" * 32,
                    "name": i,
                    "command": ["true"],
                    "env": {},
                    "gpus_per_node": 2,
                    "nodes": 1,
                }
                for i in ids
            ],
        )
        # Closed attempts whose proof is known: attempt n ran 10 s + n ms, and started at the same
        # instant as some others, so the batches' cursor must order ties by id.
        session.execute(
            insert(JobAttempt),
            [
                {
                    "job_id": job_id,
                    "attempt": 1,
                    "cpod_id": "c" * 32,
                    "gpus": 2,
                    "units": 2,
                    "price_per_hour": PRICE,
                    "fee_bp": FEE_BP,
                    "payer_id": "u" * 32,
                    "provider_id": "p" * 32,
                    "assigned_at": t0,
                    "started_at": t0 + timedelta(seconds=n // 3),
                    "finished_at": t0 + timedelta(seconds=20),
                    "proven_until": t0 + timedelta(seconds=n // 3 + 10, milliseconds=n),
                    "rated_done": False,
                }
                for n, job_id in enumerate(ids)
            ],
        )
    result = metering.meter_once(ctx, limit=3)
    assert (result.attempts, result.rated) == (7, 7)
    assert metering.meter_once(ctx, limit=3).attempts == 0  # all rated to their end
    with ctx.db.session() as session:
        attempts = session.scalars(select(JobAttempt).order_by(JobAttempt.job_id)).all()
        for n, placed in enumerate(attempts):
            usage = 10_000_000 + n * 1_000
            assert (placed.rated_us, placed.rated_done) == (usage, True)
            assert placed.charged == cost(2, PRICE, usage)
            assert placed.earned == provider_share(placed.charged, FEE_BP)
        charged = sum(p.charged for p in attempts)
        assert ledger.balance(session, ledger.account_key(ledger.USER_CASH, "u" * 32)) == -charged
        assert ledger.check(session).ok
    ctx.db.dispose()
