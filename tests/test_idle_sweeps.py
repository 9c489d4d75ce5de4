"""What the background loops cost on an idle fleet (issue 14): the liveness sweep reads only the CPods
that are overdue by their own interval, and the offers count only those with a heartbeat past their
mark. Driven directly on SQLite and PostgreSQL; rows are counted by running each SELECT again, in
the loop's own transaction, just before the loop runs it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, event, func, insert, select, update

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db import migrate
from sxwl.cloud.db.models import CPod, CPodEvent, CPodStatus, Role, User
from sxwl.cloud.db.money_models import GpuOffer
from sxwl.cloud.services.fleet import cpods
from sxwl.cloud.services.money import offers
from tests.conftest import MakeSettings
from tests.support.cpods import gpu_node

OWNER = "p" * 32
# Odd microseconds, so that a boundary falls between SQLite's milliseconds.
NOW = datetime(2026, 3, 10, 9, 0, 0, 987_654, tzinfo=UTC)
ALLOCATABLE = 6


@pytest.fixture
def ctx(make_settings: MakeSettings) -> Iterator[CloudContext]:
    settings = make_settings(heartbeat_interval_s=10, unknown_after_missed=3, offline_grace_s=60)
    context = CloudContext.from_settings(settings)
    migrate.upgrade(context.db.engine)
    with context.db.session() as session:
        session.execute(
            insert(User).values(id=OWNER, email="p@example.com", password_hash="x", role=Role.PROVIDER)
        )
    yield context
    context.db.dispose()


def add_cpods(
    ctx: CloudContext,
    prefix: str,
    count: int,
    last: datetime | None,
    interval: float = 10.0,
    status: CPodStatus = CPodStatus.ONLINE,
) -> list[str]:
    ids = [f"{prefix}{i:0{32 - len(prefix)}d}" for i in range(count)]
    nodes = [gpu_node("w1", count=8, allocatable=ALLOCATABLE)]
    with ctx.db.session() as session:
        session.execute(
            insert(CPod),
            [
                {
                    "id": cpod_id,
                    "owner_id": OWNER,
                    "name": cpod_id,
                    "cluster_uid": cpod_id,
                    "runtime": "local",
                    "agent_version": "t",
                    "status": status,
                    "last_seq": 1,
                    "last_heartbeat_at": last,
                    "heartbeat_interval_s": interval,
                    "nodes": nodes,
                    "reported_jobs": [],
                }
                for cpod_id in ids
            ],
        )
    return ids


@contextmanager
def rows_selected(ctx: CloudContext, table: str) -> Iterator[list[int]]:
    """How many rows each SELECT from ``table`` returns, in the order they run."""
    counts: list[int] = []
    pattern = re.compile(rf"^\s*SELECT\b.*\bFROM {table}\b", re.DOTALL | re.IGNORECASE)
    again = False

    def before(conn: Connection, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        nonlocal again
        if again or not pattern.match(statement):
            return
        again = True
        try:
            counts.append(len(conn.exec_driver_sql(statement, parameters).all()))
        finally:
            again = False

    event.listen(ctx.db.engine, "before_cursor_execute", before)
    try:
        yield counts
    finally:
        event.remove(ctx.db.engine, "before_cursor_execute", before)


def test_a_sweep_reads_only_the_overdue(ctx: CloudContext) -> None:
    add_cpods(ctx, "recent", 300, NOW - timedelta(seconds=25))  # 2 of 3 intervals missed
    add_cpods(ctx, "slow", 100, NOW - timedelta(seconds=100), interval=60)  # its own interval counts
    add_cpods(ctx, "unknown", 50, NOW - timedelta(seconds=20), status=CPodStatus.UNKNOWN)
    add_cpods(ctx, "never", 50, None)  # never beat: skipped, as before
    (late,) = add_cpods(ctx, "late", 1, NOW - timedelta(seconds=31))
    with rows_selected(ctx, "cpods") as rows:
        assert cpods.sweep_liveness(ctx, NOW) == [(late, CPodStatus.UNKNOWN)]
    assert rows == [1]
    # Unknown now, within the grace: read, not moved; offline once the grace is over.
    with rows_selected(ctx, "cpods") as rows:
        assert cpods.sweep_liveness(ctx, NOW + timedelta(seconds=1)) == []
    assert rows == [1]
    assert (late, CPodStatus.OFFLINE) in cpods.sweep_liveness(ctx, NOW + timedelta(seconds=59))


def test_the_filter_keeps_every_cpod_the_sweep_would_move(ctx: CloudContext) -> None:
    (due,) = add_cpods(ctx, "due", 1, NOW - timedelta(seconds=30))  # exactly 3 intervals
    (almost,) = add_cpods(ctx, "almost", 1, NOW - timedelta(seconds=30) + timedelta(microseconds=1))
    (fast,) = add_cpods(ctx, "fast", 1, NOW - timedelta(seconds=7.5), interval=2.5)
    # The cloud started watching 5 s ago: the overdue are read, but nobody is blamed for its downtime.
    with rows_selected(ctx, "cpods") as rows:
        assert cpods.sweep_liveness(ctx, NOW, watching_since=NOW - timedelta(seconds=5)) == []
    assert rows == [3]
    moved = cpods.sweep_liveness(ctx, NOW)
    assert sorted(moved) == sorted([(due, CPodStatus.UNKNOWN), (fast, CPodStatus.UNKNOWN)])
    with ctx.db.session() as session:
        assert session.scalar(select(CPod.status).where(CPod.id == almost)) == CPodStatus.ONLINE


def offered_us(ctx: CloudContext) -> dict[str, int]:
    with ctx.db.session() as session:
        rows = session.execute(select(GpuOffer.cpod_id, func.sum(GpuOffer.gpu_us)).group_by(GpuOffer.cpod_id))
        return {cpod_id: int(us) for cpod_id, us in rows}


def heartbeat(ctx: CloudContext, cpod_ids: list[str], at: datetime) -> None:
    with ctx.db.session() as session:
        session.execute(update(CPod).where(CPod.id.in_(cpod_ids)).values(last_heartbeat_at=at))


def test_a_count_with_no_new_heartbeat_reads_nothing(ctx: CloudContext) -> None:
    ids = add_cpods(ctx, "fleet", 1001, NOW)
    with rows_selected(ctx, "cpod_events") as events:
        assert offers.account_once(ctx, NOW) == 1001  # the first count only sets the marks
    assert events == [0, 0]  # one IN list per 1,000 CPods
    assert offered_us(ctx) == {}

    # All came back online at +10 s and beat at +40 s: 30 s each, from the CPods' own events only.
    with ctx.db.session() as session:
        session.execute(
            insert(CPodEvent),
            [{"cpod_id": c, "kind": "online", "at": NOW + timedelta(seconds=10)} for c in ids],
        )
    heartbeat(ctx, ids, NOW + timedelta(seconds=40))
    with rows_selected(ctx, "cpod_events") as events:
        assert offers.account_once(ctx, NOW + timedelta(seconds=45)) == 1001
    assert events == [1000, 1]
    assert offered_us(ctx) == dict.fromkeys(ids, ALLOCATABLE * 30_000_000)

    # Nothing new proven: no CPod row read, no event read, no mark moved.
    with rows_selected(ctx, "cpods") as rows, rows_selected(ctx, "cpod_events") as events:
        assert offers.account_once(ctx, NOW + timedelta(seconds=75)) == 0
    assert rows == [0] and events == []

    # One CPod beats again: it alone is read and counted.
    heartbeat(ctx, ids[:1], NOW + timedelta(seconds=80))
    with rows_selected(ctx, "cpods") as rows, rows_selected(ctx, "cpod_events") as events:
        assert offers.account_once(ctx, NOW + timedelta(seconds=105)) == 1
    assert rows == [1] and events == [1]
    assert offered_us(ctx)[ids[0]] == ALLOCATABLE * 70_000_000
    assert offered_us(ctx)[ids[1]] == ALLOCATABLE * 30_000_000
