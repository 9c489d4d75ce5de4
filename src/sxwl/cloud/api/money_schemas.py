"""Bodies of the money endpoints. Integers are micro-yuan; fields named ``*_yuan`` are decimal yuan
as strings, fields named ``*_percent`` decimal percentages as strings."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from sxwl.cloud.services.devenvs.storage import StorageLine
from sxwl.cloud.services.money.billing import Charge, StatementRow
from sxwl.protocol.fields import Name, Strict, Text
from sxwl.protocol.money import FeePercent, YuanAmount, YuanPrice, yuan

IdempotencyKey = Text


def yuan_str(micro: int) -> str:
    return str(yuan(micro))


class PriceIn(Strict):
    # "storage": saved dev environment workspaces, whose price (``price_per_hour_yuan``) is per
    # GiB-day and whose fee is always 100 % (the platform stores them; docs/billing.md).
    resource: Literal["gpu", "cpu", "storage"] = "gpu"
    product: Name = Field(default="", max_length=128)  # a GPU product as CPods report it; "" for CPU
    # Strings, or numbers: "7.20" is exact, a JSON number is taken at its decimal text.
    price_per_hour_yuan: YuanPrice = Field(strict=False)
    fee_percent: FeePercent = Field(strict=False)


class PricesIn(Strict):
    prices: list[PriceIn] = Field(default_factory=list, max_length=200)
    # Products whose price is removed: their work is not placed until priced again.
    remove: list[Name] = Field(default_factory=list, max_length=200)


class PriceOut(BaseModel):
    resource: str
    product: str
    unit: Literal["GPU-hour", "core-hour", "GiB-day"]  # what ``price_per_hour`` is the price of
    price_per_hour: int
    price_per_hour_yuan: str
    fee_percent: str
    updated_at: datetime
    updated_by: str | None


class TopUpIn(Strict):
    user_id: Text = Field(min_length=1, max_length=32)
    amount_yuan: YuanAmount = Field(strict=False)
    note: Text = Field(default="", max_length=500)
    idempotency_key: IdempotencyKey | None = Field(default=None, min_length=1, max_length=100)


class PayoutIn(Strict):
    provider_id: Text = Field(min_length=1, max_length=32)
    amount_yuan: YuanAmount = Field(strict=False)
    reference: Text = Field(min_length=1, max_length=500)
    idempotency_key: IdempotencyKey | None = Field(default=None, min_length=1, max_length=100)


class TransactionOut(BaseModel):
    id: str
    kind: str
    created_at: datetime
    amount: int
    amount_yuan: str
    note: str | None
    user_id: str | None
    provider_id: str | None
    actor: str | None


class BalanceOut(BaseModel):
    balance: int
    balance_yuan: str
    burn_per_hour: int
    running_attempts: int
    hours_left: float | None
    low: bool


class StatementOut(BaseModel):
    month: str
    lines: list[Charge]
    # Each day a paused dev environment's saved workspace was kept, at the storage price.
    storage: list[StorageLine]
    total: int
    total_yuan: str
    top_ups: list[TransactionOut]


class BreakdownOut(BaseModel):
    key: str
    unit_seconds: float
    gross: int
    fee: int
    net: int
    offered_hours: float  # GPU-hours offered, per product (0 per CPod)


class EarningsOut(BaseModel):
    month: str
    pending: int
    available: int
    paid_out: int
    today: int
    month_net: int
    month_gross: int
    month_fee: int
    sold_gpu_hours: float
    offered_gpu_hours: float
    utilisation: float | None  # sold ÷ offered GPU-hours this month; None before anything was offered
    by_cpod: list[BreakdownOut]
    by_product: list[BreakdownOut]
    lines: list[StatementRow]


class RevenueOut(BaseModel):
    fees: int
    top_ups: int
    payouts: int
    providers_pending: int
    providers_available: int
    users_cash: int
