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

from sqlalchemy import Row, Table, bindparam, literal, select, tuple_, update
from sqlalchemy.orm import Session

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import CPod, JobAttempt
from sxwl.cloud.db.types import UTCDateTime, utcnow
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
_COLUMNS = (
    JobAttempt.job_id,
    JobAttempt.attempt,
    JobAttempt.cpod_id,
    JobAttempt.started_at,
    JobAttempt.finished_at,
    JobAttempt.proven_until,
    JobAttempt.rated_us,
    JobAttempt.charged,
    JobAttempt.earned,
    JobAttempt.resource,
    JobAttempt.units,
    JobAttempt.gpu_product,
    JobAttempt.price_per_hour,
    JobAttempt.fee_bp,
    JobAttempt.payer_id,
    JobAttempt.provider_id,
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


Cursor = tuple[datetime, str, int]  # (started_at, job_id, attempt): where the last batch ended


def meter_once(ctx: CloudContext, now: datetime | None = None, limit: int | None = None) -> PassResult:
    """Rates every started attempt that is not rated to its end yet, ``limit`` attempts (the
    setting ``metering_batch`` by default) per database transaction."""
    now = now or utcnow()
    batch = limit or ctx.settings.metering_batch
    total = PassResult(0, 0, 0)
    after: Cursor | None = None
    while True:
        with ctx.db.session(immediate=True) as session:
            result, after = _pass(session, now, batch, after)
        total = PassResult(
            total.attempts + result.attempts, total.rated + result.rated, total.charged + result.charged
        )
        if after is None:
            return total


def _pass(
    session: Session, now: datetime, limit: int, after: Cursor | None
) -> tuple[PassResult, Cursor | None]:
    """One batch; the cursor to go on from, or None after the last batch."""
    stmt = (
        select(*_COLUMNS, CPod.last_heartbeat_at, CPod.reported_jobs)
        .outerjoin(CPod, CPod.id == JobAttempt.cpod_id)
        .where(JobAttempt.started_at.is_not(None), ~JobAttempt.rated_done)
        .order_by(JobAttempt.started_at, JobAttempt.job_id, JobAttempt.attempt)
        .limit(limit)
    )
    if after is not None:
        stmt = stmt.where(
            tuple_(JobAttempt.started_at, JobAttempt.job_id, JobAttempt.attempt)
            > tuple_(literal(after[0], UTCDateTime()), literal(after[1]), literal(after[2]))
        )
    if session.get_bind().dialect.name == "postgresql":
        # Another replica's pass holds some rows: this one rates the others.
        stmt = stmt.with_for_update(of=JobAttempt, skip_locked=True)
    rows = session.execute(stmt).all()
    listed_by_cpod: dict[str, frozenset[str]] = {}
    advances: list[dict[str, Any]] = []
    postings: list[Posting] = []
    charged_total = 0
    for row in rows:
        if row.cpod_id is not None and row.cpod_id not in listed_by_cpod:
            listed_by_cpod[row.cpod_id] = frozenset(row.reported_jobs or ())
        listed = f"{row.job_id}:{row.attempt}" in listed_by_cpod.get(row.cpod_id or "", frozenset())
        closed = row.finished_at is not None
        end = proof(row, row.last_heartbeat_at, listed)
        if not closed:
            end = min(end, now)
        target = max(row.rated_us, (end - row.started_at) // _US)
        if target == row.rated_us and not closed:
            continue
        charged = cost(row.units, row.price_per_hour, target)
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
        if gross:
            charged_total += gross
            postings.append(_usage_posting(row, target, gross, net, now))
    if advances:
        moved = session.execute(_ADVANCE, advances).rowcount  # type: ignore[attr-defined]
        if moved != len(advances):
            raise MarkMoved(f"{len(advances) - moved} of {len(advances)} marks moved during the pass")
        ledger.post_many(session, postings)
    cursor = (rows[-1].started_at, rows[-1].job_id, rows[-1].attempt) if len(rows) == limit else None
    return PassResult(len(rows), len(advances), charged_total), cursor


def _usage_posting(row: Row[*tuple[Any, ...]], target: int, gross: int, net: int, now: datetime) -> Posting:
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
