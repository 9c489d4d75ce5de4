"""What providers earn: usage credits their pending earnings; after the hold they become available;
an admin records payouts out of what is available. Amounts are micro-yuan."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import CPod, Role, User, new_id
from sxwl.cloud.db.money_models import LedgerAccount, LedgerTransaction
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.errors import invalid
from sxwl.cloud.services.money import ledger
from sxwl.cloud.services.money.billing import StatementRow, usage_rows
from sxwl.cloud.services.money.ledger import Posting
from sxwl.cloud.services.money.offers import offered_hours
from sxwl.protocol.money import US_PER_HOUR, yuan_text


def release_once(ctx: CloudContext, now: datetime | None = None) -> int:
    """Moves earnings older than the hold from pending to available; returns how many providers got
    some. Computed from totals (everything earned before the cutoff, minus everything released), and
    keyed by the released total, so a repeated or concurrent release moves nothing twice."""
    cutoff = (now or utcnow()) - timedelta(seconds=ctx.settings.earnings_hold_s)
    tx = LedgerTransaction
    moved = 0
    with ctx.db.session(immediate=True) as session:
        earned = dict(
            session.execute(
                select(tx.provider_id, func.sum(tx.net))
                .where(tx.kind == "usage", tx.provider_id.is_not(None), tx.created_at <= cutoff)
                .group_by(tx.provider_id)
            ).all()
        )
        released = dict(
            session.execute(
                select(tx.provider_id, func.sum(tx.gross))
                .where(tx.kind == "release")
                .group_by(tx.provider_id)
            ).all()
        )
        for provider_id, total in sorted(earned.items()):
            done = int(released.get(provider_id) or 0)
            amount = int(total or 0) - done
            if amount <= 0 or provider_id is None:
                continue
            moved += ledger.post(
                session,
                Posting(
                    f"release:{provider_id}:{done}",
                    "release",
                    {
                        ledger.account_key(ledger.PROVIDER_PENDING, provider_id): -amount,
                        ledger.account_key(ledger.PROVIDER_AVAILABLE, provider_id): amount,
                    },
                    {"provider_id": provider_id, "gross": amount, "net": amount},
                ),
            )
    return moved


def payout(
    session: Session,
    admin: User,
    *,
    provider_id: str,
    amount: int,
    reference: str,
    idempotency_key: str | None,
) -> LedgerTransaction:
    """Records money paid out to a provider (by bank transfer, say: ``reference``), out of what is
    available; more than that is a 422 on ``amount_yuan``, the field of the API's body."""
    key = f"payout:{idempotency_key or new_id()}"
    if done := ledger.replayed(session, key, owner_id=provider_id, amount=amount, what="payout"):
        return done
    provider = session.get(User, provider_id)
    if provider is None or provider.role != Role.PROVIDER:
        raise invalid("provider_id", f"no provider {provider_id}")
    available_key = ledger.account_key(ledger.PROVIDER_AVAILABLE, provider_id)
    # Locked, so two payouts at once cannot both spend the same available earnings.
    available = (
        session.scalar(
            select(LedgerAccount.balance).where(LedgerAccount.key == available_key).with_for_update()
        )
        or 0
    )
    if amount > available:
        raise invalid(
            "amount_yuan", f"is more than the {yuan_text(available)} CNY available to this provider"
        )
    ledger.post(
        session,
        Posting(
            key,
            "payout",
            {available_key: -amount, ledger.account_key(ledger.PLATFORM_PAYOUTS): amount},
            {
                "actor_id": admin.id,
                "note": reference,
                "provider_id": provider_id,
                "gross": amount,
                "net": amount,
            },
        ),
    )
    return session.scalars(select(LedgerTransaction).where(LedgerTransaction.idempotency_key == key)).one()


@dataclass
class Breakdown:
    """Usage of one CPod or one GPU product within a period."""

    key: str
    # Unit-microseconds, added up as integers and divided once: a sum of floats reads 181.00000000000003.
    unit_us: int = 0
    core_us: int = 0  # the part of unit_us that was CPU work, counted in cores
    gross: int = 0
    fee: int = 0
    net: int = 0
    offered_hours: float = 0.0  # GPU-hours offered (per product only)

    @property
    def unit_seconds(self) -> float:
        return self.unit_us / 1_000_000

    @property
    def core_seconds(self) -> float:
        return self.core_us / 1_000_000


@dataclass
class Earnings:
    """A provider's earnings: balances now, and one period's usage of its CPods."""

    pending: int
    available: int
    paid_out: int
    today: int  # net, since midnight UTC
    month: int  # net, this month
    month_gross: int
    month_fee: int
    sold_gpu_hours: float  # this month
    offered_gpu_hours: float  # this month, while online
    by_cpod: list[Breakdown] = field(default_factory=list)
    by_product: list[Breakdown] = field(default_factory=list)
    rows: list[StatementRow] = field(default_factory=list)


def earnings_of(
    session: Session, provider_id: str, start: datetime, end: datetime, now: datetime | None = None
) -> Earnings:
    now = now or utcnow()
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    rows = usage_rows(session, start, end, provider_id=provider_id)
    today_net = (
        session.scalar(
            select(func.coalesce(func.sum(LedgerTransaction.net), 0)).where(
                LedgerTransaction.kind == "usage",
                LedgerTransaction.provider_id == provider_id,
                LedgerTransaction.created_at >= today,
            )
        )
        or 0
    )
    paid = (
        session.scalar(
            select(func.coalesce(func.sum(LedgerTransaction.gross), 0)).where(
                LedgerTransaction.kind == "payout", LedgerTransaction.provider_id == provider_id
            )
        )
        or 0
    )
    by_cpod: dict[str, Breakdown] = {}
    by_product: dict[str, Breakdown] = {}
    cpod_ids = list(session.scalars(select(CPod.id).where(CPod.owner_id == provider_id)))
    offered = offered_hours(session, cpod_ids, start, end)
    for product, hours in offered.items():
        by_product[product] = Breakdown(product, offered_hours=hours)
    for row in rows:
        for table, key in ((by_cpod, row.cpod_id or "—"), (by_product, row.gpu_product or "CPU")):
            part = table.setdefault(key, Breakdown(key))
            part.unit_us += row.units * row.usage_us
            if row.resource == "cpu":
                part.core_us += row.units * row.usage_us
            part.gross += row.gross
            part.fee += row.fee
            part.net += row.net
    return Earnings(
        pending=ledger.balance(session, ledger.account_key(ledger.PROVIDER_PENDING, provider_id)),
        available=ledger.balance(session, ledger.account_key(ledger.PROVIDER_AVAILABLE, provider_id)),
        paid_out=int(paid),
        today=int(today_net),
        month=sum(r.net for r in rows),
        month_gross=sum(r.gross for r in rows),
        month_fee=sum(r.fee for r in rows),
        sold_gpu_hours=sum(r.units * r.usage_us for r in rows if r.resource == "gpu") / US_PER_HOUR,
        offered_gpu_hours=round(sum(offered.values()), 6),
        by_cpod=sorted(by_cpod.values(), key=lambda b: -b.net),
        by_product=sorted(by_product.values(), key=lambda b: -b.net),
        rows=rows,
    )


@dataclass(frozen=True)
class Revenue:
    fees: int  # the platform's fee revenue, all time
    top_ups: int
    payouts: int
    pending: int  # owed to providers, not yet available
    available: int  # owed to providers, payable now
    user_cash: int  # what users hold


def platform_revenue(session: Session) -> Revenue:
    per_kind = dict(
        session.execute(
            select(LedgerAccount.kind, func.coalesce(func.sum(LedgerAccount.balance), 0)).group_by(
                LedgerAccount.kind
            )
        ).all()
    )
    return Revenue(
        fees=int(per_kind.get(ledger.PLATFORM_FEES, 0)),
        top_ups=-int(per_kind.get(ledger.PLATFORM_TOP_UPS, 0)),
        payouts=int(per_kind.get(ledger.PLATFORM_PAYOUTS, 0)),
        pending=int(per_kind.get(ledger.PROVIDER_PENDING, 0)),
        available=int(per_kind.get(ledger.PROVIDER_AVAILABLE, 0)),
        user_cash=int(per_kind.get(ledger.USER_CASH, 0)),
    )
