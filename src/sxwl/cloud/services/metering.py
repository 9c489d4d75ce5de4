"""One metering pass: rates the usage that accrued on every started attempt since the last pass.

Usage runs from the agent's ``running`` report to the end of the attempt, capped at the last moment
something proves it alive (invariant 9, docs/architecture.md): while its CPod's heartbeats list it,
the last heartbeat; once they stop listing it, the last one that did; once it closes, what was
proven then. Each rating is one ledger transaction whose idempotency key names the attempt and the
mark it starts from, written in the same database transaction as the conditional update that moves
the mark, so a crash or two replicas rating at once can neither lose nor double a second."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, cast

from sqlalchemy import (
    BigInteger,
    Boolean,
    Integer,
    String,
    Table,
    bindparam,
    column,
    func,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import CPod, JobAttempt
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services import ledger
from sxwl.cloud.services.ledger import Posting
from sxwl.protocol.money import cost, provider_share

_US = timedelta(microseconds=1)
_ATTEMPTS = cast(Table, JobAttempt.__table__)
_ADVANCE = (
    update(_ATTEMPTS)
    .where(
        _ATTEMPTS.c.job_id == bindparam("b_job"),
        _ATTEMPTS.c.attempt == bindparam("b_attempt"),
        _ATTEMPTS.c.rated_us == bindparam("b_from"),
        ~_ATTEMPTS.c.rated_done,
    )
    .values(
        rated_us=bindparam("b_to"),
        charged=bindparam("b_charged"),
        earned=bindparam("b_earned"),
        rated_done=bindparam("b_done"),
    )
)
_MARK_COLUMNS = (
    ("b_job", String),
    ("b_attempt", Integer),
    ("b_from", BigInteger),
    ("b_to", BigInteger),
    ("b_charged", BigInteger),
    ("b_earned", BigInteger),
    ("b_done", Boolean),
)
# On PostgreSQL the marks travel as one array per column, unnested into rows by the server: one
# statement for the whole batch, where an executemany costs the server a statement per attempt.
_MARKS = (
    func.unnest(*(bindparam(name, type_=ARRAY(kind)) for name, kind in _MARK_COLUMNS))
    .table_valued(*(column(name, kind) for name, kind in _MARK_COLUMNS))
    .render_derived(name="marks")
)
_ADVANCE_ALL = (
    update(_ATTEMPTS)
    .where(
        _ATTEMPTS.c.job_id == _MARKS.c.b_job,
        _ATTEMPTS.c.attempt == _MARKS.c.b_attempt,
        _ATTEMPTS.c.rated_us == _MARKS.c.b_from,
        ~_ATTEMPTS.c.rated_done,
    )
    .values(
        rated_us=_MARKS.c.b_to,
        charged=_MARKS.c.b_charged,
        earned=_MARKS.c.b_earned,
        rated_done=_MARKS.c.b_done,
    )
)
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
        "resource",
        "units",
        "gpu_product",
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
    advances: list[dict[str, Any]] = []
    postings: list[Posting] = []
    charged_total = 0
    for row in rows:
        beat, listed_jobs = heartbeats.get(row.cpod_id or "", (None, frozenset()))
        listed = f"{row.job_id}:{row.attempt}" in listed_jobs
        closed = row.finished_at is not None
        end = proof(row, beat, listed)
        if not closed:
            end = min(end, now)
        target = max(row.rated_us, (end - row.started_at) // _US)
        charged = cost(row.units, row.price_per_hour, target)
        # A running attempt's mark waits until its usage costs something: otherwise its seconds
        # would be in no transaction, and statements would count fewer GPU-seconds than were rated.
        if not closed and (target == row.rated_us or charged == row.charged):
            continue
        earned = provider_share(charged, row.fee_bp)
        gross, net = charged - row.charged, earned - row.earned
        advances.append(
            {
                "b_job": row.job_id,
                "b_attempt": row.attempt,
                "b_from": row.rated_us,
                "b_to": target,
                "b_charged": charged,
                "b_earned": earned,
                "b_done": closed,
            }
        )
        # A closed attempt's last slice is posted even when it is too short to cost a micro-yuan, so
        # the statement still shows its seconds; work that is free (price 0) posts nothing.
        if gross or (target > row.rated_us and row.price_per_hour):
            charged_total += gross
            postings.append(_usage_posting(row, target, gross, net, now))
    if advances:
        moved = _advance(session, advances)
        if moved != len(advances):
            raise MarkMoved(f"{len(advances) - moved} of {len(advances)} marks moved during the pass")
        ledger.post_many(session, postings)
    last = (rows[-1].started_at, rows[-1].job_id, rows[-1].attempt) if len(rows) == limit else None
    return PassResult(len(rows), len(advances), charged_total), last


def _advance(session: Session, advances: list[dict[str, Any]]) -> int:
    """Moves the marks ``advances`` from where they were read; returns how many moved."""
    if session.get_bind().dialect.name == "postgresql":
        arrays = {name: [advance[name] for advance in advances] for name, _ in _MARK_COLUMNS}
        return cast(int, session.execute(_ADVANCE_ALL, arrays).rowcount)  # type: ignore[attr-defined]
    return cast(int, session.execute(_ADVANCE, advances).rowcount)  # type: ignore[attr-defined]


def _usage_posting(row: Any, target: int, gross: int, net: int, now: datetime) -> Posting:
    fee = gross - net
    payer = ledger.account_key(ledger.USER_CASH, row.payer_id) if row.payer_id else None
    # A provider whose account is gone earns nothing: the platform keeps it.
    if row.provider_id:
        provider, provider_amount = ledger.account_key(ledger.PROVIDER_PENDING, row.provider_id), net
    else:
        provider, provider_amount, fee = None, 0, gross
    entries: dict[str, int] = {ledger.account_key(ledger.PLATFORM_FEES): fee}
    if provider:
        entries[provider] = provider_amount
    # A payer whose account is gone is charged to the platform's own fee account (never lost).
    if payer:
        entries[payer] = -gross
    else:
        entries[ledger.account_key(ledger.PLATFORM_FEES)] -= gross
    return Posting(
        idempotency_key=f"usage:{row.job_id}:{row.attempt}:{row.rated_us}",
        kind="usage",
        entries=entries,
        fields={
            "created_at": now,
            "payer_id": row.payer_id,
            "provider_id": row.provider_id,
            "job_id": row.job_id,
            "attempt": row.attempt,
            "cpod_id": row.cpod_id,
            "resource": row.resource,
            "gpu_product": row.gpu_product,
            "units": row.units,
            "usage_us": target - row.rated_us,
            "unit_price": row.price_per_hour,
            "gross": gross,
            "fee": gross - net if row.provider_id else gross,
            "net": net if row.provider_id else 0,
        },
    )
