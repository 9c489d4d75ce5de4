"""Money: a user's balance and statements, a provider's earnings, an admin's prices, top-ups and
payouts. Thin: the services hold the rules (services/money/billing.py, earnings.py, prices.py)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from sxwl.cloud.api.deps import Ctx, CurrentAdmin, CurrentUser
from sxwl.cloud.api.money_schemas import (
    BalanceOut,
    BreakdownOut,
    EarningsOut,
    PayoutIn,
    PriceOut,
    PricesIn,
    RevenueOut,
    StatementOut,
    TopUpIn,
    TransactionOut,
    yuan_str,
)
from sxwl.cloud.api.responses import NO_STORE, SIGNED_IN, WITH_BODY, errors, no_store
from sxwl.cloud.db.models import Role, User
from sxwl.cloud.db.money_models import LedgerTransaction, PriceResource
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.errors import AppError, invalid
from sxwl.cloud.services.devenvs import storage
from sxwl.cloud.services.devenvs.storage import StorageLine
from sxwl.cloud.services.money import billing, earnings, prices
from sxwl.cloud.services.money.billing import StatementRow
from sxwl.protocol.money import percent_text

router = APIRouter(tags=["money"], responses=SIGNED_IN)
Month = Annotated[str | None, Query(max_length=7, description="YYYY-MM (UTC); default: this month")]
Format = Annotated[Literal["json", "csv"], Query()]
CSV_TYPE = "text/csv; charset=utf-8"


def _month(month: str | None) -> tuple[str, datetime, datetime]:
    month = month or utcnow().strftime("%Y-%m")
    try:
        start, end = billing.month_bounds(month)
    except ValueError as error:
        raise invalid("month", str(error)) from None
    return month, start, end


def _csv(
    rows: list[StatementRow], name: str, *, provider: bool = False, storage_lines: Sequence[StorageLine] = ()
) -> Response:
    return Response(
        billing.statement_csv(rows, provider=provider) + storage.csv_rows(list(storage_lines)),
        media_type=CSV_TYPE,
        headers={"Content-Disposition": f'attachment; filename="{name}.csv"', **NO_STORE},
    )


def _transaction(session: Session, tx: LedgerTransaction) -> TransactionOut:
    actor = session.get(User, tx.actor_id) if tx.actor_id else None
    return TransactionOut(
        id=tx.id,
        kind=tx.kind,
        created_at=tx.created_at,
        amount=tx.gross,
        amount_yuan=yuan_str(tx.gross),
        note=tx.note,
        user_id=tx.payer_id,
        provider_id=tx.provider_id,
        actor=actor.email if actor else None,
    )


@router.get("/billing/balance", response_model=BalanceOut)
def balance(user: CurrentUser, ctx: Ctx) -> BalanceOut:
    with ctx.db.session() as session:
        now = billing.balance_of(session, user.id)
    return BalanceOut(
        balance=now.balance,
        balance_yuan=yuan_str(now.balance),
        burn_per_hour=now.burn_per_hour,
        running_attempts=now.running,
        hours_left=now.hours_left,
        low=now.low,
    )


@router.get(
    "/billing/statement",
    response_model=StatementOut,
    responses={200: {"content": {CSV_TYPE: {}}}},
    dependencies=[Depends(no_store)],
)
def statement(
    user: CurrentUser, ctx: Ctx, month: Month = None, format: Format = "json"
) -> Response | StatementOut:
    """What the user paid per job attempt in a month; ``format=csv`` downloads it."""
    name, start, end = _month(month)
    with ctx.db.session() as session:
        rows = billing.usage_rows(session, start, end, payer_id=user.id)
        kept = storage.lines_for(session, user.id, name)
        if format == "csv":
            return _csv(rows, f"sxwl-statement-{name}", storage_lines=kept)
        top_ups = [_transaction(session, tx) for tx in billing.top_ups(session, user.id, start, end)]
    total = sum(r.gross for r in rows) + sum(line.gross for line in kept)
    return StatementOut(
        month=name,
        lines=billing.charges(rows),
        storage=kept,
        total=total,
        total_yuan=yuan_str(total),
        top_ups=top_ups,
    )


@router.get(
    "/earnings",
    response_model=EarningsOut,
    responses={200: {"content": {CSV_TYPE: {}}}},
    dependencies=[Depends(no_store)],
)
def provider_earnings(
    user: CurrentUser, ctx: Ctx, month: Month = None, format: Format = "json"
) -> Response | EarningsOut:
    """A provider's earnings: pending (held), available, paid out; this month per CPod and product."""
    if user.role != Role.PROVIDER:
        raise AppError(403, "earnings are a provider's (算力源)")
    name, start, end = _month(month)
    with ctx.db.session() as session:
        mine = earnings.earnings_of(session, user.id, start, end)
    if format == "csv":
        return _csv(mine.rows, f"sxwl-earnings-{name}", provider=True)

    def parts(items: list[earnings.Breakdown]) -> list[BreakdownOut]:
        return [
            BreakdownOut(
                key=b.key,
                unit_seconds=b.unit_seconds,
                gross=b.gross,
                fee=b.fee,
                net=b.net,
                offered_hours=b.offered_hours,
            )
            for b in items
        ]

    return EarningsOut(
        month=name,
        pending=mine.pending,
        available=mine.available,
        paid_out=mine.paid_out,
        today=mine.today,
        month_net=mine.month,
        month_gross=mine.month_gross,
        month_fee=mine.month_fee,
        sold_gpu_hours=mine.sold_gpu_hours,
        offered_gpu_hours=mine.offered_gpu_hours,
        utilisation=mine.sold_gpu_hours / mine.offered_gpu_hours if mine.offered_gpu_hours else None,
        by_cpod=parts(mine.by_cpod),
        by_product=parts(mine.by_product),
        lines=mine.rows,
    )


def _prices(session: Session) -> list[PriceOut]:
    rows = prices.listing(session)
    ids = {row.updated_by_id for row in rows if row.updated_by_id}
    emails = dict(session.execute(select(User.id, User.email).where(User.id.in_(ids))).all())
    return [
        PriceOut(
            resource=row.resource.value,
            product=row.product,
            unit=prices.UNITS[row.resource],
            price_per_hour=row.price_per_hour,
            price_per_hour_yuan=yuan_str(row.price_per_hour),
            fee_percent=percent_text(row.fee_bp),
            updated_at=row.updated_at,
            updated_by=emails.get(row.updated_by_id or ""),
        )
        for row in rows
    ]


@router.get("/admin/prices", response_model=list[PriceOut])
def list_prices(admin: CurrentAdmin, ctx: Ctx) -> list[PriceOut]:
    with ctx.db.session() as session:
        return _prices(session)


@router.put("/admin/prices", response_model=list[PriceOut], responses=WITH_BODY | errors(404))
def put_prices(body: PricesIn, admin: CurrentAdmin, ctx: Ctx) -> list[PriceOut]:
    """Sets the listed prices (and removes those in ``remove``) in one transaction. Attempts already
    placed keep the price they were placed at."""
    if not body.prices and not body.remove:
        raise invalid("prices", "give the prices to set, or the products to remove")
    with ctx.db.session() as session:
        for item in body.prices:
            resource = PriceResource(item.resource)
            if resource == PriceResource.GPU and not item.product:
                raise invalid("prices.product", "a GPU price needs the product it is for")
            prices.set_price(
                session,
                admin,
                resource=resource,
                product=item.product,
                rate=prices.Rate(item.price_per_hour_yuan, item.fee_percent),
            )
        for product in body.remove:
            prices.set_price(session, admin, resource=PriceResource.GPU, product=product, rate=None)
        session.flush()
        return _prices(session)


@router.post(
    "/admin/top-ups", status_code=201, response_model=TransactionOut, responses=WITH_BODY | errors(409)
)
def top_up(body: TopUpIn, admin: CurrentAdmin, ctx: Ctx) -> TransactionOut:
    """Adds money to a user's balance (no payment gateway yet): one ledger transaction."""
    with ctx.db.session() as session:
        tx = billing.top_up(
            session,
            admin,
            user_id=body.user_id,
            amount=body.amount_yuan,
            note=body.note,
            idempotency_key=body.idempotency_key,
        )
        return _transaction(session, tx)


@router.post(
    "/admin/payouts", status_code=201, response_model=TransactionOut, responses=WITH_BODY | errors(409)
)
def payout(body: PayoutIn, admin: CurrentAdmin, ctx: Ctx) -> TransactionOut:
    """Records money paid to a provider out of its available earnings."""
    with ctx.db.session(immediate=True) as session:
        tx = earnings.payout(
            session,
            admin,
            provider_id=body.provider_id,
            amount=body.amount_yuan,
            reference=body.reference,
            idempotency_key=body.idempotency_key,
        )
        return _transaction(session, tx)


@router.get("/admin/revenue", response_model=RevenueOut)
def revenue(admin: CurrentAdmin, ctx: Ctx) -> RevenueOut:
    with ctx.db.session() as session:
        r = earnings.platform_revenue(session)
    return RevenueOut(
        fees=r.fees,
        top_ups=r.top_ups,
        payouts=r.payouts,
        providers_pending=r.pending,
        providers_available=r.available,
        users_cash=r.user_cash,
    )
