"""The storage price of saved workspaces (docs/billing.md, "Saved workspaces"): each UTC day a paused
environment's workspace is in the artifact store, its owner pays the price per GiB-day for its bytes,
to the platform, which stores it (no provider earns any of it). A day is charged once per
environment, whichever replica or pass charges it: the transaction's idempotency key and the
charge's primary key are both (environment, day)."""

from __future__ import annotations

import csv
import io
from datetime import datetime
from decimal import Decimal

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.devenv_models import DevEnv, DevEnvState
from sxwl.cloud.db.money_models import LedgerTransaction, StorageCharge
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services.money import billing, ledger
from sxwl.cloud.services.money.ledger import Posting
from sxwl.cloud.services.money.prices import price_book
from sxwl.protocol.money import yuan_text

GIB = 1 << 30


def day_cost(price_per_gib_day: int, size: int) -> int:
    """Micro-yuan for ``size`` bytes kept one day, rounded down (as usage is: never more than used)."""
    return price_per_gib_day * size // GIB


def charge_key(env_id: str, day: str) -> str:
    return f"storage:{env_id}:{day}"


def charge_once(ctx: CloudContext, now: datetime | None = None) -> int:
    """Charges the day of ``now`` (UTC) for every paused environment with a saved workspace not yet
    charged for it; the number charged. Nothing while the price is 0 (unset) or billing is off."""
    if not ctx.settings.billing_enabled:
        return 0
    day = (now or utcnow()).date().isoformat()
    with ctx.db.session() as session:
        price = price_book(session).storage_per_gib_day
        if not price:
            return 0
        done = select(StorageCharge.dev_env_id).where(StorageCharge.day == day)
        envs = session.scalars(
            select(DevEnv).where(
                DevEnv.state == DevEnvState.PAUSED, DevEnv.saved.is_not(None), DevEnv.id.not_in(done)
            )
        ).all()
        charged = 0
        for env in envs:
            charged += _charge(session, env, day, price)
        return charged


def _charge(session: Session, env: DevEnv, day: str, price: int) -> int:
    size = int(env.saved["size"]) if env.saved else 0
    gross = day_cost(price, size)
    if gross <= 0:
        return 0
    key = charge_key(env.id, day)
    posting = Posting(
        key,
        "storage",
        {
            ledger.account_key(ledger.USER_CASH, env.owner_id): -gross,
            ledger.account_key(ledger.PLATFORM_STORAGE): gross,
        },
        {
            "payer_id": env.owner_id,
            "gross": gross,
            "fee": gross,
            "note": f"saved workspace of {env.name}, {day}",
        },
    )
    if not ledger.post(session, posting):  # another replica charged this day first
        return 0
    tx_id = session.scalar(select(LedgerTransaction.id).where(LedgerTransaction.idempotency_key == key))
    assert tx_id is not None  # posted just now, in this transaction
    session.add(
        StorageCharge(
            dev_env_id=env.id,
            day=day,
            payer_id=env.owner_id,
            bytes=size,
            price_per_gib_day=price,
            gross=gross,
            transaction_id=tx_id,
        )
    )
    return 1


class StorageLine(BaseModel):
    """One day of one environment's saved workspace, as a statement lists it."""

    model_config = ConfigDict(frozen=True)

    dev_env_id: str
    name: str
    day: str
    bytes: int
    price_per_gib_day: int = Field(description="micro-yuan per GiB-day")
    gross: int = Field(description="micro-yuan the user paid")


def lines_for(session: Session, user_id: str, month: str) -> list[StorageLine]:
    """The caller's storage charges of ``month`` (YYYY-MM), by day and environment."""
    rows = session.execute(
        select(StorageCharge, DevEnv.name)
        .join(DevEnv, DevEnv.id == StorageCharge.dev_env_id)
        .where(StorageCharge.payer_id == user_id, StorageCharge.day.startswith(f"{month}-"))
        .order_by(StorageCharge.day, StorageCharge.dev_env_id)
    ).all()
    return [
        StorageLine(
            dev_env_id=c.dev_env_id,
            name=name,
            day=c.day,
            bytes=c.bytes,
            price_per_gib_day=c.price_per_gib_day,
            gross=c.gross,
        )
        for c, name in rows
    ]


def csv_rows(lines: list[StorageLine]) -> str:
    """``lines`` in the statement's CSV columns (billing.CSV_COLUMNS): the environment for the job,
    the day for the attempt, "saved workspace" for the product, GiB-days for the unit-seconds and
    the price per GiB-day for the unit price."""
    out = io.StringIO()
    writer = csv.writer(out)
    for line in lines:
        gib_days = Decimal(line.bytes) / GIB
        writer.writerow(
            [
                line.dev_env_id,
                billing.csv_cell(line.name),
                line.day,
                "saved workspace",
                f"{gib_days:.6f}",
                yuan_text(line.price_per_gib_day, 6),
                yuan_text(line.gross, 6),
            ]
        )
    return out.getvalue()


def totals(session: Session, env_ids: list[str]) -> dict[str, int]:
    """What each environment's saved workspace has cost so far."""
    if not env_ids:
        return {}
    return dict(
        session.execute(
            select(StorageCharge.dev_env_id, func.sum(StorageCharge.gross))
            .where(StorageCharge.dev_env_id.in_(env_ids))
            .group_by(StorageCharge.dev_env_id)
        ).all()
    )
