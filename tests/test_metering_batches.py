"""A metering pass over more attempts than one batch holds rates them all, each batch in its own
transaction with one ledger transaction per payer and provider and a usage line per attempt, and
every attempt exactly to its proven end (SQLite and PostgreSQL); a slice rated twice is refused."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from sqlalchemy import func, insert, select, update
from sqlalchemy.exc import IntegrityError

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db import migrate
from sxwl.cloud.db.models import CPod, CPodStatus, Job, JobAttempt, Role, User
from sxwl.cloud.db.money_models import LedgerTransaction, UsageLine
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services.money import ledger, metering
from sxwl.protocol.money import cost, provider_share
from tests.conftest import MakeSettings

PRICE = 7_200_000  # 7.20 CNY per GPU-hour
FEE_BP = 1_250  # 12.5 %


def _closed_attempts(make_settings: MakeSettings) -> CloudContext:
    """Seven closed attempts of one user on one provider's CPod, not rated yet."""
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
    return ctx


def test_a_pass_rates_every_batch_once(make_settings: MakeSettings) -> None:
    ctx = _closed_attempts(make_settings)
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
        # Batches of 3, 3 and 1 attempts: a transaction each, and a line per attempt in it.
        batches = session.scalars(select(LedgerTransaction).where(LedgerTransaction.kind == "usage")).all()
        lines = session.scalars(select(UsageLine)).all()
        per_tx = Counter(line.transaction_id for line in lines)
        assert sorted(per_tx.values()) == [1, 3, 3] and set(per_tx) == {t.id for t in batches}
        assert {(line.job_id, line.from_us, line.to_us) for line in lines} == {
            (p.job_id, 0, p.rated_us) for p in attempts
        }
        for tx in batches:
            mine = [line for line in lines if line.transaction_id == tx.id]
            assert (tx.gross, tx.net) == (sum(x.gross for x in mine), sum(x.net for x in mine))
            assert (tx.payer_id, tx.provider_id, tx.fee) == ("u" * 32, "p" * 32, tx.gross - tx.net)
        # A line that no longer adds up to its transaction fails the check.
        (tampered,) = (line for line in lines if line.job_id == attempts[0].job_id)
        session.execute(
            update(UsageLine).where(UsageLine.job_id == tampered.job_id).values(gross=UsageLine.gross + 1)
        )
        report = ledger.check(session)
        assert not report.ok
        assert report.unlined == [t.idempotency_key for t in batches if t.id == tampered.transaction_id]
        session.rollback()
    ctx.db.dispose()


def test_a_slice_rated_twice_is_refused(make_settings: MakeSettings) -> None:
    """A pass that rated from marks already rated (as if it had read them before another replica
    committed) collides with the usage lines and the ledger transaction posted for them: nothing of
    it is written."""
    ctx = _closed_attempts(make_settings)
    assert metering.meter_once(ctx).rated == 7
    with ctx.db.session() as session:
        before = session.scalar(select(func.count()).select_from(LedgerTransaction))
        cash = ledger.balance(session, ledger.account_key(ledger.USER_CASH, "u" * 32))
        session.execute(update(JobAttempt).values(rated_us=0, charged=0, earned=0, rated_done=False))
    with pytest.raises(IntegrityError):
        metering.meter_once(ctx)
    with ctx.db.session() as session:
        assert session.scalar(select(func.count()).select_from(LedgerTransaction)) == before
        assert ledger.balance(session, ledger.account_key(ledger.USER_CASH, "u" * 32)) == cash
        assert session.scalar(select(func.count()).select_from(UsageLine)) == 7
    ctx.db.dispose()
