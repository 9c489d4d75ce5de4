"""A database seeded with started attempts whose usage is known exactly, the cloud's metering loop
to run in a process that is killed at random moments, and the checks that every second of it was
rated once (tests/test_metering_crash.py, bench/metering.py).

Rows go in through the ORM's tables in bulk, as the scheduler and heartbeats would leave them:
open attempts listed by their CPod's last heartbeat, closed ones with their proof frozen."""

from __future__ import annotations

import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.migrate import upgrade
from sxwl.cloud.db.models import CPod, CPodStatus, Job, JobAttempt, JobState, Role, User
from sxwl.cloud.db.money_models import UsageLine
from sxwl.cloud.services.money import billing, earnings, ledger, metering
from sxwl.protocol.money import cost, provider_share
from tests.support.cloud import test_settings

_US = timedelta(microseconds=1)
# Micro-yuan per unit-hour: a cheap, a common and an odd price, so rounding is exercised.
PRICES = (500_000, 7_200_000, 12_345_678)
TOP_UP = 10**12  # more than any seeded usage costs: no balance reaches zero here


def context(data_dir: Path, url: str, **overrides: object) -> CloudContext:
    return CloudContext.from_settings(test_settings(data_dir, url, billing_enabled=True, **overrides))


@dataclass(frozen=True)
class Attempt:
    job_id: str
    usage_us: int  # what the attempt is proven to have run: every rating together must be this
    units: int
    price: int
    fee_bp: int
    payer_id: str

    @property
    def charged(self) -> int:
        return cost(self.units, self.price, self.usage_us)

    @property
    def earned(self) -> int:
        return provider_share(self.charged, self.fee_bp)


@dataclass(frozen=True)
class Seeded:
    end: datetime  # the last heartbeat of every CPod: a pass at this moment or later rates all
    attempts: list[Attempt]
    provider_id: str


def seed(
    ctx: CloudContext, *, cpods: int, attempts: int, end: datetime, closed_share: float = 0.5, seed: int = 1
) -> Seeded:
    """Migrates the database and writes ``attempts`` started attempts spread over ``cpods`` CPods of
    one provider, paid for by a few users with a top-up of ``TOP_UP`` each; started up to an hour
    before ``end``, at microsecond moments. A ``closed_share`` of them ended before ``end``."""
    upgrade(ctx.db.engine)
    rng = random.Random(seed)
    users = [
        {"id": f"u{i:031d}", "email": f"user{i}@metering.test", "password_hash": "-", "role": Role.USER}
        for i in range(5)
    ]
    admin = {"id": "a" * 32, "email": "admin@metering.test", "password_hash": "-", "role": Role.ADMIN}
    provider = {
        "id": "p" * 32,
        "email": "provider@metering.test",
        "password_hash": "-",
        "role": Role.PROVIDER,
    }
    pods: list[dict[str, Any]] = [
        {
            "id": f"c{i:031d}",
            "owner_id": provider["id"],
            "name": f"cpod-{i}",
            "cluster_uid": f"cluster-{i}",
            "runtime": "local",
            "agent_version": "test",
            "status": CPodStatus.ONLINE,
            "heartbeat_interval_s": 10.0,
            "last_heartbeat_at": end,
            "nodes": [],
            "reported_jobs": [],
        }
        for i in range(cpods)
    ]
    jobs: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    expected: list[Attempt] = []
    for i in range(attempts):
        job_id = f"j{i:031d}"
        payer = users[i % len(users)]["id"]
        pod = pods[i % cpods]
        units, price, fee_bp = rng.choice((1, 2, 8)), rng.choice(PRICES), rng.choice((0, 1000, 1250))
        started = end - timedelta(seconds=rng.uniform(60, 3600))
        closed = rng.random() < closed_share
        proven = end - (end - started) * rng.uniform(0.1, 0.9) if closed else None
        jobs.append(
            {
                "id": job_id,
                "owner_id": payer,
                "name": f"job-{i}",
                "command": ["true"],
                "gpu_product": "H200",
                "gpus_per_node": units,
                "nodes": 1,
                "state": JobState.SUCCEEDED if closed else JobState.RUNNING,
                "attempt": 1,
                "cpod_id": pod["id"],
            }
        )
        rows.append(
            {
                "job_id": job_id,
                "attempt": 1,
                "cpod_id": pod["id"],
                "node_names": ["n0"],
                "gpus": units,
                "assigned_at": started - timedelta(seconds=30),
                "started_at": started,
                "finished_at": proven,
                "outcome": "succeeded" if closed else None,
                "resource": "gpu",
                "units": units,
                "gpu_product": "H200",
                "price_per_hour": price,
                "fee_bp": fee_bp,
                "payer_id": payer,
                "provider_id": provider["id"],
                "proven_until": proven,
                "rated_us": 0,
                "charged": 0,
                "earned": 0,
                "rated_done": False,
            }
        )
        if not closed:
            pod["reported_jobs"].append(f"{job_id}:1")
        usage = ((proven or end) - started) // _US
        expected.append(Attempt(job_id, usage, units, price, fee_bp, payer))
    with ctx.db.session() as session:
        session.execute(insert(User), [*users, admin, provider])
        session.execute(insert(CPod), pods)
        session.execute(insert(Job), jobs)
        session.execute(insert(JobAttempt), rows)
    with ctx.db.session() as session:
        admin_user = session.get(User, admin["id"])
        assert admin_user is not None
        for user in users:
            billing.top_up(
                session,
                admin_user,
                user_id=user["id"],
                amount=TOP_UP,
                note="seed",
                idempotency_key=user["id"],
            )
    return Seeded(end, expected, provider["id"])


def problems(session: Session, seeded: Seeded, *, complete: bool) -> list[str]:
    """Everything that is not exactly once: empty when the ledger checks, every attempt's usage
    lines follow one another from its start and add up to its rated mark and charge, and the
    balances to the charges. ``complete``:
    also every proven second rated (after a pass at ``seeded.end`` or later); otherwise the marks
    may be anywhere, as a crash left them."""
    found: list[str] = []
    report = ledger.check(session)
    if not report.ok:
        found.append(f"ledger check: {report}")
    marks = {
        row.job_id: row
        for row in session.execute(
            select(JobAttempt.job_id, JobAttempt.rated_us, JobAttempt.charged, JobAttempt.earned)
        )
    }
    lines: dict[str, list[Any]] = defaultdict(list)
    for line in session.execute(
        select(UsageLine.job_id, UsageLine.from_us, UsageLine.to_us, UsageLine.gross, UsageLine.net).order_by(
            UsageLine.job_id, UsageLine.from_us
        )
    ):
        lines[line.job_id].append(line)
    spent: Counter[str] = Counter()
    earned = 0
    for attempt in seeded.attempts:
        mark, slices = marks[attempt.job_id], lines.get(attempt.job_id, [])
        got_mark = (mark.rated_us, mark.charged, mark.earned)
        posted = (
            sum(s.to_us - s.from_us for s in slices),
            sum(s.gross for s in slices),
            sum(s.net for s in slices),
        )
        # The slices follow one another from the start: none overlaps another, none leaves a gap.
        chained = [s.from_us for s in slices] == [0, *(s.to_us for s in slices)][: len(slices)]
        charged = cost(attempt.units, attempt.price, mark.rated_us)
        want = (attempt.usage_us, attempt.charged, attempt.earned) if complete else got_mark
        if (
            got_mark != want
            or posted != got_mark
            or not chained
            or mark.charged != charged
            or mark.rated_us > attempt.usage_us
        ):
            found.append(f"{attempt.job_id}: proven {attempt.usage_us} us, rated {got_mark}, posted {posted}")
        spent[attempt.payer_id] += mark.charged
        earned += mark.earned
    cash = ledger.balances(session, ledger.USER_CASH, spent)
    for payer, total in spent.items():
        if cash.get(payer) != TOP_UP - total:
            found.append(f"user {payer}: balance {cash.get(payer)}, expected {TOP_UP - total}")
    pending = ledger.balance(session, ledger.account_key(ledger.PROVIDER_PENDING, seeded.provider_id))
    available = ledger.balance(session, ledger.account_key(ledger.PROVIDER_AVAILABLE, seeded.provider_id))
    if pending < 0 or pending + available != earned:
        found.append(f"provider: {pending} pending + {available} available, {earned} earned")
    return found


def usage_slices(session: Session) -> dict[str, int]:
    """How many usage lines each attempt got (more than one: it was rated in slices)."""
    per_job = select(UsageLine.job_id, func.count()).group_by(UsageLine.job_id)
    return {job_id: int(count) for job_id, count in session.execute(per_job)}


def meter_loop(
    data_dir: Path, url: str, start: datetime, speed: float, limit: int, release: bool, passes: Any
) -> None:
    """A cloud process's metering loop, until it is killed: the cloud's own ``meter_once`` (in
    batches of ``limit``, a transaction each) and ``release_once``, with its own context, on a clock
    that starts at ``start`` and runs ``speed`` times as fast as the wall clock, so every pass rates
    a new slice of each running attempt. Counts its passes in the shared integer ``passes`` (a
    ``multiprocessing.Value``, written without a lock: a kill cannot leave one held)."""
    # No hold: what one pass earns is released while other passes still rate.
    ctx = context(data_dir, url, earnings_hold_s=0)
    began = time.monotonic()
    while True:
        now = start + timedelta(seconds=(time.monotonic() - began) * speed)
        metering.meter_once(ctx, now=now, limit=limit)
        if release:
            earnings.release_once(ctx, now=now)
        passes.value += 1
