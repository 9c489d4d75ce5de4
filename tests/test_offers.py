"""GPU time offered, counted from heartbeats per CPod, day and product: the denominator of a
provider's utilisation. Driven directly on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import insert, select, update

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db import migrate
from sxwl.cloud.db.models import CPod, CPodEvent, CPodStatus, Role, User
from sxwl.cloud.db.money_models import GpuOffer
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services.money import offers
from tests.conftest import MakeSettings
from tests.support.cpods import A100, gpu_node

CPOD = "c" * 32
T0 = utcnow().replace(hour=10, minute=0, second=0, microsecond=0)


@pytest.fixture
def ctx(make_settings: MakeSettings) -> Iterator[CloudContext]:
    context = CloudContext.from_settings(make_settings(billing_enabled=True))
    migrate.upgrade(context.db.engine)
    with context.db.session() as session:
        session.execute(
            insert(User).values(id="p" * 32, email="p@example.com", password_hash="x", role=Role.PROVIDER)
        )
        session.execute(
            insert(CPod).values(
                id=CPOD,
                owner_id="p" * 32,
                name="c",
                cluster_uid="c",
                runtime="local",
                agent_version="t",
                token_hash="h",
                status=CPodStatus.ONLINE,
                last_seq=1,
                last_heartbeat_at=T0,
                heartbeat_interval_s=10.0,
                # 8 GPUs, 6 allocatable; a node that is not ready offers nothing.
                nodes=[gpu_node("w1", count=8, allocatable=6), gpu_node("w2", count=8, status="not_ready")],
                reported_jobs=[],
            )
        )
    yield context
    context.db.dispose()


def heartbeat(ctx: CloudContext, at: object, status: CPodStatus = CPodStatus.ONLINE) -> None:
    with ctx.db.session() as session:
        session.execute(update(CPod).where(CPod.id == CPOD).values(last_heartbeat_at=at, status=status))


def offered_us(ctx: CloudContext) -> dict[str, int]:
    with ctx.db.session() as session:
        return {
            o.day: o.gpu_us
            for o in session.scalars(select(GpuOffer).where(GpuOffer.gpu_product == A100["product"]))
        }


def test_offered_time_runs_between_heartbeats_and_skips_time_away(ctx: CloudContext) -> None:
    day = T0.strftime("%Y-%m-%d")
    assert offers.account_once(ctx, T0) == 1  # the first count only sets the mark
    assert offered_us(ctx) == {}
    heartbeat(ctx, T0 + timedelta(seconds=90))
    # Counted up to the last heartbeat, not up to now: 6 allocatable GPUs × 90 s.
    offers.account_once(ctx, T0 + timedelta(seconds=100))
    assert offered_us(ctx) == {day: 6 * 90_000_000}
    offers.account_once(ctx, T0 + timedelta(seconds=110))  # nothing new proven: nothing added
    assert offered_us(ctx) == {day: 6 * 90_000_000}

    # Offline for an hour, back online at +3690 s (its "online" event), heartbeat at +3700 s: only
    # the 10 s since it came back count.
    with ctx.db.session() as session:
        session.add(CPodEvent(cpod_id=CPOD, kind="online", at=T0 + timedelta(seconds=3690)))
    heartbeat(ctx, T0 + timedelta(seconds=3700))
    offers.account_once(ctx, T0 + timedelta(seconds=3700))
    assert offered_us(ctx) == {day: 6 * 100_000_000}

    with ctx.db.session() as session:
        hours = offers.offered_hours(
            session, [CPOD], T0.replace(hour=0), T0.replace(hour=0) + timedelta(days=1)
        )
    assert hours == {A100["product"]: 6 * 100 / 3600}


def test_a_cpod_that_is_not_online_offers_nothing(ctx: CloudContext) -> None:
    offers.account_once(ctx, T0)
    heartbeat(ctx, T0 + timedelta(seconds=60), CPodStatus.UNKNOWN)
    assert offers.account_once(ctx, T0 + timedelta(seconds=60)) == 0
    assert offered_us(ctx) == {}
