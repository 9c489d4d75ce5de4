"""Scheduling passes against a real database (SQLite and PostgreSQL), driven directly: replicas with
their own capacity caches, changes behind a cache's back, and a cancel racing the batched writes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import func, insert, select, update

from sxwl.cloud.config import Settings
from sxwl.cloud.context import CloudContext
from sxwl.cloud.db import migrate
from sxwl.cloud.db.models import CPod, CPodStatus, Job, JobAttempt, JobEvent, JobState, Role, User
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services.scheduling import scheduler
from sxwl.protocol.reasons import english
from tests.conftest import MakeSettings
from tests.support.cpods import A100, gpu_node

PRODUCT = A100["product"]
CPOD = "c" * 32
USER = "u" * 32


@pytest.fixture
def settings(make_settings: MakeSettings) -> Settings:
    return make_settings()


@pytest.fixture
def ctx(settings: Settings) -> Iterator[CloudContext]:
    context = CloudContext.from_settings(settings)
    migrate.upgrade(context.db.engine)
    with context.db.session() as session:
        session.execute(
            insert(User),
            [
                {"id": "p" * 32, "email": "p@example.com", "password_hash": "x", "role": Role.PROVIDER},
                {"id": USER, "email": "u@example.com", "password_hash": "x", "role": Role.USER},
            ],
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
                last_heartbeat_at=utcnow(),
                heartbeat_interval_s=30.0,
                nodes=[gpu_node("w1", count=8)],
                reported_jobs=[],
            )
        )
    yield context
    context.db.dispose()


@pytest.fixture
def replica(settings: Settings) -> Iterator[CloudContext]:
    """Another cloud process on the same database, with a capacity cache of its own."""
    context = CloudContext.from_settings(settings)
    yield context
    context.db.dispose()


def submit(ctx: CloudContext, count: int, gpus: int) -> list[str]:
    ids = [f"j{gpus}{i:030d}" for i in range(count)]
    with ctx.db.session() as session:
        session.execute(
            insert(Job),
            [
                {
                    "id": job_id,
                    "owner_id": USER,
                    "name": job_id,
                    "command": ["true"],
                    "env": {},
                    "gpu_product": PRODUCT,
                    "gpus_per_node": gpus,
                    "nodes": 1,
                    "state": JobState.QUEUED,
                    "node_names": [],
                    "reason": "waiting for the scheduler",
                }
                for job_id in ids
            ],
        )
    return ids


def set_state(ctx: CloudContext, job_id: str, state: JobState) -> None:
    with ctx.db.session() as session:
        session.execute(update(Job).where(Job.id == job_id).values(state=state))


def heartbeat(ctx: CloudContext, **values: Any) -> None:
    with ctx.db.session() as session:
        session.execute(
            update(CPod)
            .where(CPod.id == CPOD)
            .values(last_seq=CPod.last_seq + 1, last_heartbeat_at=utcnow(), **values)
        )


def gpus_held(ctx: CloudContext) -> int:
    with ctx.db.session() as session:
        return int(
            session.scalar(select(func.sum(Job.gpus_per_node)).where(Job.state == JobState.ASSIGNED)) or 0
        )


def test_a_warm_cache_sees_what_another_replica_assigned_and_freed(
    ctx: CloudContext, replica: CloudContext
) -> None:
    jobs = submit(ctx, 6, 4)
    first = scheduler.schedule_once(ctx)
    assert len(first) == 2 and gpus_held(ctx) == 8
    set_state(ctx, first[0].job_id, JobState.SUCCEEDED)
    assert len(scheduler.schedule_once(replica)) == 1  # the other replica takes the 4 free GPUs
    # This replica's cache still holds the finished job and has never seen the new one: it must
    # not hand out those 4 GPUs again.
    assert scheduler.schedule_once(ctx) == []
    assert gpus_held(ctx) == 8
    set_state(ctx, first[1].job_id, JobState.FAILED)
    again = scheduler.schedule_once(ctx)
    assert len(again) == 1 and again[0].job_id in jobs and gpus_held(ctx) == 8


def test_a_warm_cache_follows_heartbeats_and_liveness(ctx: CloudContext) -> None:
    submit(ctx, 8, 1)
    heartbeat(ctx, nodes=[gpu_node("w1", count=8, used=6)])  # GPUs used outside sxwl
    assert len(scheduler.schedule_once(ctx)) == 2
    heartbeat(ctx, nodes=[gpu_node("w1", count=8, used=0, status="not_ready")])
    assert scheduler.schedule_once(ctx) == []
    heartbeat(ctx, nodes=[gpu_node("w1", count=8, used=0)])
    with ctx.db.session() as session:
        session.execute(update(CPod).where(CPod.id == CPOD).values(status=CPodStatus.UNKNOWN))
    assert scheduler.schedule_once(ctx) == []
    with ctx.db.session() as session:
        session.execute(update(CPod).where(CPod.id == CPOD).values(status=CPodStatus.ONLINE))
        reason = session.scalar(select(Job.reason).where(Job.state == JobState.QUEUED).limit(1))
    assert english(reason) == f"no online CPod offers 1 × {PRODUCT}"
    # The agent now reports its two jobs and counts their GPUs as used: still 6 free, not 4.
    assigned = [f"{j}:1" for j in _assigned_ids(ctx)]
    heartbeat(ctx, nodes=[gpu_node("w1", count=8, used=2)], reported_jobs=assigned)
    assert len(scheduler.schedule_once(ctx)) == 6 and gpus_held(ctx) == 8


def _assigned_ids(ctx: CloudContext) -> list[str]:
    with ctx.db.session() as session:
        return list(session.scalars(select(Job.id).where(Job.state == JobState.ASSIGNED)))


def test_a_cancel_that_wins_the_race_leaves_no_attempt(
    ctx: CloudContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim, other = submit(ctx, 2, 1)
    decide = scheduler._decide

    def cancel_after_deciding(*args: Any) -> Any:
        writes = decide(*args)
        # A user cancels between the pass's decision and its writes (another connection).
        with ctx.db.session() as session:
            session.execute(update(Job).where(Job.id == victim).values(state=JobState.CANCELLED))
        return writes

    monkeypatch.setattr(scheduler, "_decide", cancel_after_deciding)
    assigned = scheduler.schedule_once(ctx)
    assert [a.job_id for a in assigned] == [other]
    with ctx.db.session() as session:
        job = session.get(Job, victim)
        assert job is not None and job.state == JobState.CANCELLED and job.attempt == 0
        assert session.scalar(select(func.count()).where(JobAttempt.job_id == victim)) == 0
        assert session.scalar(select(func.count()).where(JobEvent.job_id == victim)) == 0
    monkeypatch.undo()
    assert len(submit(ctx, 7, 2)) == 7
    assert len(scheduler.schedule_once(ctx)) == 3  # 7 GPUs free: the cancelled job holds none
