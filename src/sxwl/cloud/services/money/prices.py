"""Prices: per GPU product (and for CPU cores) what users pay per unit-hour and the platform's fee.
There is never a default price: work on a product without one is not placed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from sxwl.cloud.db.models import User
from sxwl.cloud.db.money_models import Price, PriceChange, PriceResource
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.errors import AppError


@dataclass(frozen=True)
class Rate:
    price_per_hour: int  # micro-yuan per unit-hour
    fee_bp: int


FREE = Rate(0, 0)  # what attempts are placed at when billing is off (never when it is on)


@dataclass(frozen=True)
class PriceBook:
    """The prices in force, read once per scheduling pass."""

    gpu: dict[str, Rate]
    cpu: Rate | None
    storage_per_gib_day: int = 0  # micro-yuan per GiB-day of saved workspace; 0 (unset): free

    def for_product(self, product: str | None) -> Rate | None:
        return self.cpu if product is None else self.gpu.get(product)

    def cheapest_gpu(self) -> Rate | None:
        return min(self.gpu.values(), key=lambda r: r.price_per_hour, default=None)


UNITS: Final[dict[PriceResource, Literal["GPU-hour", "core-hour", "GiB-day"]]] = {
    PriceResource.GPU: "GPU-hour",
    PriceResource.CPU: "core-hour",
    PriceResource.STORAGE: "GiB-day",
}
_NAMES = {PriceResource.CPU: "CPU cores", PriceResource.STORAGE: "saved workspaces", PriceResource.GPU: ""}


def cpu_units(cpus: int | None, nodes: int) -> int:
    """The cores a CPU-only attempt is billed for: those it asked for per node, 1 when it asked for none."""
    return (cpus or 1) * nodes


def price_book(session: Session) -> PriceBook:
    gpu: dict[str, Rate] = {}
    cpu: Rate | None = None
    storage = 0
    for row in session.scalars(select(Price)):
        rate = Rate(row.price_per_hour, row.fee_bp)
        if row.resource == PriceResource.CPU:
            cpu = rate
        elif row.resource == PriceResource.STORAGE:
            storage = row.price_per_hour  # per GiB-day (docs/billing.md)
        else:
            gpu[row.product] = rate
    return PriceBook(gpu, cpu, storage)


def listing(session: Session) -> list[Price]:
    return list(session.scalars(select(Price).order_by(Price.resource.desc(), Price.product)))


def set_price(
    session: Session, admin: User, *, resource: PriceResource, product: str, rate: Rate | None
) -> Price | None:
    """Sets (or, with ``rate`` None, removes) one price, and records who did it and when. Attempts
    already placed keep the price they were placed at. The storage price (per GiB-day) is all the
    platform's: it stores the workspaces, so its fee is 100 %."""
    if resource == PriceResource.STORAGE and rate is not None:
        rate = Rate(rate.price_per_hour, 10_000)
    if resource in (PriceResource.CPU, PriceResource.STORAGE):
        product = ""
    elif not product:
        raise AppError(422, "product: a GPU price needs its product", details=[{"field": "product"}])
    row = session.get(Price, (resource, product), with_for_update=True)
    session.add(
        PriceChange(
            resource=resource.value,
            product=product,
            price_per_hour=rate.price_per_hour if rate else None,
            fee_bp=rate.fee_bp if rate else None,
            actor_id=admin.id,
        )
    )
    if rate is None:
        if row is None:
            raise AppError(404, f"no price is set for {product or _NAMES[resource]}")
        session.delete(row)
        return None
    if row is None:
        row = Price(resource=resource, product=product, price_per_hour=0, fee_bp=0)
        session.add(row)
    row.price_per_hour, row.fee_bp = rate.price_per_hour, rate.fee_bp
    row.updated_at, row.updated_by_id = utcnow(), admin.id
    return row
