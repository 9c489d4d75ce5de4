"""What compute users pay: top-ups, the balance a submission needs, the burn rate, the cost of a
job so far, and monthly statements. Amounts are micro-yuan (protocol/money.py)."""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from pydantic import BaseModel, ConfigDict, Field, computed_field
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import CPod, Job, JobAttempt, Role, User, new_id
from sxwl.cloud.db.money_models import LedgerTransaction, UsageLine
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.errors import AppError, invalid
from sxwl.cloud.services.money import ledger
from sxwl.cloud.services.money.ledger import Posting
from sxwl.cloud.services.money.metering import proof
from sxwl.cloud.services.money.prices import Rate, cpu_units, price_book
from sxwl.protocol import attempt_key
from sxwl.protocol.jobs import JobFields
from sxwl.protocol.money import cost, yuan_text

FIRST_HOUR_S = 3600
_US = timedelta(microseconds=1)


def top_up(
    session: Session, admin: User, *, user_id: str, amount: int, note: str, idempotency_key: str | None
) -> LedgerTransaction:
    """Adds ``amount`` to a user's cash, recorded with who and when. A repeated ``idempotency_key``
    returns the first top-up instead of adding again."""
    key = f"top_up:{idempotency_key or new_id()}"
    if done := ledger.replayed(session, key, owner_id=user_id, amount=amount, what="top-up"):
        return done
    user = session.get(User, user_id)
    if user is None:
        raise invalid("user_id", f"no user {user_id}")
    if user.role == Role.PROVIDER:
        raise invalid("user_id", "providers do not run jobs; top up a compute user's account")
    ledger.post(
        session,
        Posting(
            key,
            "top_up",
            {
                ledger.account_key(ledger.USER_CASH, user.id): amount,
                ledger.account_key(ledger.PLATFORM_TOP_UPS): -amount,
            },
            {"actor_id": admin.id, "note": note, "payer_id": user.id, "gross": amount},
        ),
    )
    return session.scalars(select(LedgerTransaction).where(LedgerTransaction.idempotency_key == key)).one()


def rate_for(session: Session, spec: JobFields, cpus: int | None = None) -> tuple[int, Rate | None]:
    """The units a job is billed for and the price it would be placed at (for a GPU job that names no
    product, the cheapest priced one); None: no price yet, the job waits in the queue. Without GPUs
    the units are the cores it asked for per node (``cpus``; 1 when it asked for none)."""
    book = price_book(session)
    if not spec.gpus_per_node:
        return cpu_units(cpus, spec.nodes), book.cpu
    rate = book.gpu.get(spec.gpu_product) if spec.gpu_product else book.cheapest_gpu()
    return spec.gpus_per_node * spec.nodes, rate


def estimate(
    session: Session, spec: JobFields, seconds: int | None = None, cpus: int | None = None
) -> int | None:
    """What the job costs for ``seconds`` (default: its maximum runtime); None: unknown."""
    units, rate = rate_for(session, spec, cpus)
    seconds = seconds if seconds is not None else spec.max_runtime_s
    if rate is None or seconds is None:
        return None
    return cost(units, rate.price_per_hour, seconds * 1_000_000)


def require_funds(
    ctx: CloudContext, session: Session, owner: User, spec: JobFields, cpus: int | None = None
) -> None:
    """A submission needs a positive balance that covers the job's first hour (or its maximum
    runtime, if shorter): 402 with the amount missing otherwise."""
    if not ctx.settings.billing_enabled:
        return
    balance = ledger.balance(session, ledger.account_key(ledger.USER_CASH, owner.id))
    first = min(FIRST_HOUR_S, spec.max_runtime_s or FIRST_HOUR_S)
    needed = estimate(session, spec, first, cpus) or 0
    if balance > 0 and balance >= needed:
        return
    missing = max(needed - balance, 1 - balance if balance <= 0 else 0)
    if needed:
        message = (
            f"your balance of {yuan_text(balance)} CNY does not cover this job's first "
            f"{first // 60} minutes ({yuan_text(needed)} CNY): {yuan_text(missing)} CNY missing"
        )
    else:  # no price yet: the job would wait in the queue, but an empty balance never submits
        message = f"your balance is {yuan_text(balance)} CNY: top up before submitting jobs"
    raise AppError(
        402,
        message,
        code="insufficient_balance",
        details={"balance": balance, "required": needed, "missing": missing},
    )


@dataclass(frozen=True)
class Balance:
    balance: int
    burn_per_hour: int  # micro-yuan per hour at the attempts running now
    running: int  # attempts running and charged now

    @property
    def hours_left(self) -> float | None:
        return self.balance / self.burn_per_hour if self.burn_per_hour else None

    @property
    def low(self) -> bool:
        """Less than an hour of the current burn is left."""
        return self.burn_per_hour > 0 and self.balance < self.burn_per_hour


def balance_of(session: Session, user_id: str) -> Balance:
    burn, running = session.execute(
        select(func.coalesce(func.sum(JobAttempt.units * JobAttempt.price_per_hour), 0), func.count()).where(
            JobAttempt.payer_id == user_id,
            JobAttempt.started_at.is_not(None),
            JobAttempt.finished_at.is_(None),
            JobAttempt.price_per_hour > 0,
        )
    ).one()
    return Balance(ledger.balance(session, ledger.account_key(ledger.USER_CASH, user_id)), int(burn), running)


@dataclass(frozen=True)
class JobCost:
    cost: int  # so far: rated, plus what has accrued since the last rating up to the last proof
    per_hour: int  # while running; 0 otherwise
    running: bool


def job_cost(session: Session, job: Job, now: datetime | None = None) -> JobCost:
    return job_costs(session, [job.id], now)[job.id]


def job_costs(session: Session, job_ids: list[str], now: datetime | None = None) -> dict[str, JobCost]:
    """``job_cost`` of each job, in two queries however many (a page of a list)."""
    now = now or utcnow()
    attempts = attempts_of(session, job_ids)
    open_on = {p.cpod_id for placed in attempts.values() for p in placed if _accruing(p) and p.cpod_id}
    beats = {
        cpod_id: (at, frozenset(reported))
        for cpod_id, at, reported in session.execute(
            select(CPod.id, CPod.last_heartbeat_at, CPod.reported_jobs).where(CPod.id.in_(open_on))
        )
    }
    costs = {}
    for job_id in job_ids:
        total, per_hour, running = 0, 0, False
        for placed in attempts.get(job_id, []):
            total += _so_far(placed, beats.get(placed.cpod_id or ""), now)
            if placed.started_at is not None and placed.finished_at is None:
                per_hour += placed.units * placed.price_per_hour
                running = True
        costs[job_id] = JobCost(total, per_hour, running)
    return costs


def attempts_of(session: Session, job_ids: list[str]) -> dict[str, list[JobAttempt]]:
    """The attempts of each job, in attempt order."""
    found: dict[str, list[JobAttempt]] = {}
    query = select(JobAttempt).where(JobAttempt.job_id.in_(job_ids)).order_by(JobAttempt.attempt)
    for placed in session.scalars(query):
        found.setdefault(placed.job_id, []).append(placed)
    return found


def _accruing(placed: JobAttempt) -> bool:
    return placed.started_at is not None and not placed.rated_done


def _so_far(placed: JobAttempt, beat: tuple[datetime | None, frozenset[str]] | None, now: datetime) -> int:
    """``beat``: the last heartbeat of the attempt's CPod and the attempts it listed, if it has one."""
    if placed.started_at is None or placed.rated_done:
        return placed.charged
    listed = beat is not None and attempt_key(placed.job_id, placed.attempt) in beat[1]
    end = proof(placed, beat[0] if beat else None, listed)
    if placed.finished_at is None:
        end = min(end, now)
    usage = max(placed.rated_us, (end - placed.started_at) // _US)
    return cost(placed.units, placed.price_per_hour, usage)


# ASCII digits only: strptime also takes "2026-1" and full-width digits, which then reach the CSV's
# file name (an HTTP header, latin-1) as they were given.
_MONTH = re.compile(r"[0-9]{4}-[0-9]{2}")


def month_bounds(month: str) -> tuple[datetime, datetime]:
    """The first instant of ``month`` (YYYY-MM, UTC) and of the next; ValueError when it is not one."""
    try:
        if not _MONTH.fullmatch(month):
            raise ValueError(month)
        start = datetime.strptime(month, "%Y-%m").replace(tzinfo=UTC)
        end = (
            start.replace(year=start.year + 1, month=1)
            if start.month == 12
            else start.replace(month=start.month + 1)
        )
    except ValueError:  # not a month, or 9999-12, whose end no datetime holds
        raise ValueError("must be a month as YYYY-MM, such as 2026-12") from None
    return start, end


class Charge(BaseModel):
    """One attempt's usage within a month as its user pays for it: a row of the user's statement, in
    the API as here (no CPod, no split of the amount between provider and platform: not the
    user's)."""

    model_config = ConfigDict(frozen=True)

    job_id: str
    job_name: str
    attempt: int
    resource: str
    gpu_product: str | None
    units: int
    usage_us: int = Field(description="of the attempt, exact (unit-seconds are this times units)")
    unit_price: int = Field(description="micro-yuan per unit-hour")
    gross: int = Field(description="micro-yuan the user paid")

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented use
    @property
    def unit_seconds(self) -> float:
        return self.units * self.usage_us / 1_000_000


class StatementRow(Charge):
    """The same usage as its provider earns it: the CPod that ran it and the platform's fee."""

    cpod_id: str | None
    fee: int
    net: int = Field(description="micro-yuan the provider earned")


def charges(rows: list[StatementRow]) -> list[Charge]:
    """What the user's statement shows of each row."""
    return [Charge.model_validate(row.model_dump(include=set(Charge.model_fields))) for row in rows]


def usage_rows(
    session: Session,
    start: datetime,
    end: datetime,
    *,
    payer_id: str | None = None,
    provider_id: str | None = None,
) -> list[StatementRow]:
    """Usage between ``start`` and ``end`` of one payer or one provider, one row per attempt: the
    usage lines of the period's usage transactions, with what the attempt fixed when it was placed."""
    tx, line, placed = LedgerTransaction, UsageLine, JobAttempt
    stmt = (
        select(
            line.job_id,
            func.coalesce(Job.name, ""),
            line.attempt,
            placed.cpod_id,
            placed.resource,
            placed.gpu_product,
            placed.units,
            func.sum(line.to_us - line.from_us),
            placed.price_per_hour,
            func.sum(line.gross),
            func.sum(line.gross - line.net),
            func.sum(line.net),
        )
        .select_from(line)
        .join(tx, tx.id == line.transaction_id)
        .join(placed, (placed.job_id == line.job_id) & (placed.attempt == line.attempt))
        .outerjoin(Job, Job.id == line.job_id)
        .where(tx.kind == "usage", tx.created_at >= start, tx.created_at < end)
        .group_by(
            line.job_id,
            Job.name,
            line.attempt,
            placed.cpod_id,
            placed.resource,
            placed.gpu_product,
            placed.units,
            placed.price_per_hour,
        )
        .order_by(func.min(tx.created_at), line.job_id, line.attempt)
    )
    if payer_id is not None:
        stmt = stmt.where(tx.payer_id == payer_id)
    if provider_id is not None:
        stmt = stmt.where(tx.provider_id == provider_id)
    return [
        StatementRow(
            job_id=r[0],
            job_name=r[1],
            attempt=r[2],
            cpod_id=r[3],
            resource=r[4],
            gpu_product=r[5],
            units=r[6],
            usage_us=int(r[7]),
            unit_price=r[8],
            gross=int(r[9]),
            fee=int(r[10]),
            net=int(r[11]),
        )
        for r in session.execute(stmt)
    ]


# A user's statement: what they paid. A provider's earnings add the CPod and the split.
CSV_COLUMNS = ("job", "job_name", "attempt", "gpu_product", "gpu_seconds", "unit_price_per_hour", "gross")
EARNINGS_CSV_COLUMNS = (*CSV_COLUMNS[:3], "cpod", *CSV_COLUMNS[3:], "fee", "net")


def csv_cell(text: str) -> str:
    """Text that a spreadsheet would run as a formula is quoted: job names are the user's and GPU
    products the provider's, and each reads the other's in a statement or earnings download."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def statement_csv(rows: list[StatementRow], *, provider: bool = False) -> str:
    """The user's statement (``provider``: the provider's earnings) as CSV, in exact yuan."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(EARNINGS_CSV_COLUMNS if provider else CSV_COLUMNS)
    for row in rows:
        cells: list[str | int] = [row.job_id, csv_cell(row.job_name), row.attempt]
        if provider:
            cells.append(row.cpod_id or "")
        # Unit-seconds exactly: usage is whole microseconds.
        seconds = Decimal(row.units * row.usage_us).scaleb(-6)
        cells += [csv_cell(row.gpu_product or "CPU"), f"{seconds:.6f}", yuan_text(row.unit_price, 6)]
        cells.append(yuan_text(row.gross, 6))
        if provider:
            cells += [yuan_text(row.fee, 6), yuan_text(row.net, 6)]
        writer.writerow(cells)
    return out.getvalue()


def top_ups(session: Session, user_id: str, start: datetime, end: datetime) -> list[LedgerTransaction]:
    return list(
        session.scalars(
            select(LedgerTransaction)
            .where(
                LedgerTransaction.kind == "top_up",
                LedgerTransaction.payer_id == user_id,
                LedgerTransaction.created_at >= start,
                LedgerTransaction.created_at < end,
            )
            .order_by(LedgerTransaction.created_at)
        )
    )
