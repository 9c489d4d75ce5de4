"""One metering pass: rates the usage that accrued on every started attempt since the last pass.

Usage runs from the agent's ``running`` report to the end of the attempt, capped at the last moment
something proves it alive (invariant 9, docs/architecture.md): while its CPod's heartbeats list it,
the last heartbeat; once they stop listing it, the last one that did; once it closes, what was
proven then. A batch's rating is one ledger transaction per payer and provider, with an idempotency
key derived from the slices it rates, and one usage line per attempt (keyed by the attempt and the
mark it starts from), written in the same database transaction as the conditional update that moves
the marks, so a crash or two replicas rating at once can neither lose nor double a second."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol, cast

from sqlalchemy import Table, select, tuple_
from sqlalchemy.orm import Session

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import CPod, JobAttempt
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services.money import ledger, metering_writes
from sxwl.cloud.services.money.ledger import Posting
from sxwl.cloud.services.money.metering_writes import Slices
from sxwl.protocol import attempt_key
from sxwl.protocol.money import cost, provider_share

_US = timedelta(microseconds=1)
# How long a running attempt runs before its first slice is rated: longer than an agent takes to
# report that the command never started after all (docs/billing.md).
FIRST_SLICE_US = 10_000_000
_ATTEMPTS = cast(Table, JobAttempt.__table__)
_CPODS = cast(Table, CPod.__table__)
_COLUMNS = tuple(
    _ATTEMPTS.c[name]
    for name in (
        "job_id",
        "attempt",
        "cpod_id",
        "started_at",
        "finished_at",
        "proven_until",
        "rated_us",
        "charged",
        "earned",
        "units",
        "price_per_hour",
        "fee_bp",
        "payer_id",
        "provider_id",
    )
)


class MarkMoved(RuntimeError):
    """An attempt's mark moved under a pass that held its row: never expected; the pass rolls back."""


@dataclass(frozen=True)
class PassResult:
    attempts: int  # attempts looked at
    rated: int  # attempts whose mark moved
    charged: int  # micro-yuan charged by this pass


class Started(Protocol):
    """What proves an attempt alive: a JobAttempt, or a row of its columns."""

    @property
    def started_at(self) -> datetime | None: ...
    @property
    def finished_at(self) -> datetime | None: ...
    @property
    def proven_until(self) -> datetime | None: ...


def proof(attempt: Started, cpod_heartbeat: datetime | None, listed: bool) -> datetime:
    """The last moment a started attempt is proven alive."""
    assert attempt.started_at is not None
    if attempt.finished_at is None and listed and cpod_heartbeat is not None:
        latest = cpod_heartbeat
    else:
        latest = attempt.proven_until or attempt.started_at
    return max(latest, attempt.started_at)


def meter_once(ctx: CloudContext, now: datetime | None = None, limit: int | None = None) -> PassResult:
    """Rates every started attempt that is not rated to its end yet, ``limit`` of them (the oldest
    first) per database transaction, so a pass over more open attempts than that reaches them all."""
    now = now or utcnow()
    batch = limit or ctx.settings.metering_batch
    total = PassResult(0, 0, 0)
    after: tuple[datetime, str, int] | None = None
    while True:
        with ctx.db.session(immediate=True) as session:
            result, after = _pass(session, now, batch, after)
        total = PassResult(
            total.attempts + result.attempts, total.rated + result.rated, total.charged + result.charged
        )
        if after is None:
            return total


def _pass(
    session: Session, now: datetime, limit: int, after: tuple[datetime, str, int] | None
) -> tuple[PassResult, tuple[datetime, str, int] | None]:
    """One batch, from the attempt after ``after`` in (started_at, job, attempt) order; also returns
    where the next batch starts (None after the last one)."""
    order = (_ATTEMPTS.c.started_at, _ATTEMPTS.c.job_id, _ATTEMPTS.c.attempt)
    stmt = (
        select(*_COLUMNS)
        .where(_ATTEMPTS.c.started_at.is_not(None), ~_ATTEMPTS.c.rated_done)
        .order_by(*order)
        .limit(limit)
    )
    if after is not None:
        stmt = stmt.where(tuple_(*order) > after)
    if session.get_bind().dialect.name == "postgresql":
        # Another replica's pass holds some rows: this one rates the others.
        stmt = stmt.with_for_update(of=_ATTEMPTS, skip_locked=True)
    rows = session.execute(stmt).all()
    # Each CPod read once, not once per attempt: its list of attempts is a JSON document. A heartbeat
    # that stops listing an attempt also writes the attempt's row, which this pass holds (or, on
    # SQLite, the whole database), so the CPod read here still agrees with the attempts read above.
    heartbeats: dict[str, tuple[datetime | None, frozenset[str]]] = {
        cpod_id: (beat, frozenset(listed or ()))
        for cpod_id, beat, listed in session.execute(
            select(_CPODS.c.id, _CPODS.c.last_heartbeat_at, _CPODS.c.reported_jobs).where(
                _CPODS.c.id.in_({row.cpod_id for row in rows if row.cpod_id is not None})
            )
        )
    }
    slices = Slices()
    # One ledger transaction per (payer, provider): the slices it posts.
    groups: dict[tuple[str | None, str | None], list[int]] = defaultdict(list)
    for row in rows:
        beat, listed_jobs = heartbeats.get(row.cpod_id or "", (None, frozenset()))
        listed = attempt_key(row.job_id, row.attempt) in listed_jobs
        closed = row.finished_at is not None
        end = proof(row, beat, listed)
        if not closed:
            end = min(end, now)
        target = max(row.rated_us, (end - row.started_at) // _US)
        charged = cost(row.units, row.price_per_hour, target)
        # A running attempt's mark waits until its usage costs something: otherwise its seconds
        # would be in no usage line, and statements would count fewer GPU-seconds than were rated.
        # Its first slice also waits out FIRST_SLICE_US, so that a start whose command never ran
        # (reported as such within a second or two) was never rated and costs nothing.
        first = row.rated_us == 0
        if not closed and (
            target == row.rated_us or charged == row.charged or (first and target < FIRST_SLICE_US)
        ):
            continue
        earned = provider_share(charged, row.fee_bp)
        gross = charged - row.charged
        # A closed attempt's last slice is posted even when it is too short to cost a micro-yuan, so
        # the statement still shows its seconds; work that is free (price 0) posts nothing.
        if gross or (target > row.rated_us and row.price_per_hour):
            groups[(row.payer_id, row.provider_id)].append(len(slices))
        slices.jobs.append(row.job_id)
        slices.attempts.append(row.attempt)
        slices.froms.append(row.rated_us)
        slices.tos.append(target)
        slices.charged.append(charged)
        slices.earned.append(earned)
        slices.done.append(closed)
        slices.gross.append(gross)
        # A provider whose account is gone earns nothing: the platform keeps it.
        slices.net.append(earned - row.earned if row.provider_id else 0)
        slices.groups.append(None)
    if slices:
        for group, posted in enumerate(groups.values(), start=1):
            for i in posted:
                slices.groups[i] = group
        # The transactions first: the lines reference them.
        postings = [
            _usage_posting(payer, provider, slices, posted, now)
            for (payer, provider), posted in groups.items()
        ]
        moved = metering_writes.write(session, slices, ledger.post_many(session, postings))
        if moved != len(slices):
            raise MarkMoved(f"{len(slices) - moved} of {len(slices)} marks moved during the pass")
    last = (rows[-1].started_at, rows[-1].job_id, rows[-1].attempt) if len(rows) == limit else None
    return PassResult(len(rows), len(slices), sum(slices.gross)), last


def _usage_posting(
    payer_id: str | None, provider_id: str | None, slices: Slices, posted: list[int], now: datetime
) -> Posting:
    """The usage of one payer's attempts on one provider's CPods in a batch (``slices`` at the
    indices ``posted``): user −gross, provider +net, the platform the rest. Its idempotency key is
    derived from the slices it rates (each attempt and the mark it starts from), so the same rating
    always has the same key."""
    gross = sum(slices.gross[i] for i in posted)
    net = sum(slices.net[i] for i in posted)
    fees = ledger.account_key(ledger.PLATFORM_FEES)
    entries: dict[str, int] = {fees: gross - net}
    if provider_id:
        entries[ledger.account_key(ledger.PROVIDER_PENDING, provider_id)] = net
    # A payer whose account is gone is charged to the platform's own fee account (never lost).
    if payer_id:
        entries[ledger.account_key(ledger.USER_CASH, payer_id)] = -gross
    else:
        entries[fees] -= gross
    keys = sorted(f"{slices.jobs[i]}:{slices.attempts[i]}:{slices.froms[i]}" for i in posted)
    return Posting(
        idempotency_key="usage:" + hashlib.sha256("\n".join(keys).encode()).hexdigest(),
        kind="usage",
        entries=entries,
        fields={
            "created_at": now,
            "payer_id": payer_id,
            "provider_id": provider_id,
            "gross": gross,
            "fee": gross - net,
            "net": net,
        },
    )
