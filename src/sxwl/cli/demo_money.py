"""Money for ``sxwl up``'s demo: prices for what this machine offers and a first top-up of the demo
user, so the demo job is billed and the demo provider earns. Idempotent over restarts, and never
over an admin's decision: a price is set only where no one ever set (or removed) one."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from sxwl.agent.inventory.nvml import NvmlReader
from sxwl.cloud.db.models import User
from sxwl.cloud.db.money_models import PriceChange, PriceResource
from sxwl.cloud.services.money import billing, ledger, prices
from sxwl.protocol.money import MICRO

DEMO_GPU_PRICE = prices.Rate(price_per_hour=2 * MICRO, fee_bp=1000)  # 2.00 CNY per GPU-hour, fee 10 %
DEMO_CPU_PRICE = prices.Rate(price_per_hour=MICRO // 2, fee_bp=1000)  # 0.50 CNY per core-hour, fee 10 %
DEMO_CREDIT = 100 * MICRO
DEMO_CREDIT_KEY = "demo-user-credit"  # once per database: restarts add nothing


def local_gpu_products() -> list[str]:
    """The GPU products the demo's local agent will report (none on a machine without NVIDIA GPUs)."""
    reader = NvmlReader()
    try:
        gpu = reader.read()
    finally:
        reader.close()
    return [gpu.product] if gpu else []


def ensure_demo_prices(session: Session, admin: User, gpu_products: list[str]) -> None:
    wanted = [(PriceResource.CPU, "", DEMO_CPU_PRICE)]
    wanted += [(PriceResource.GPU, product, DEMO_GPU_PRICE) for product in gpu_products]
    for resource, product, rate in wanted:
        touched = session.scalar(
            select(PriceChange.id).where(
                PriceChange.resource == resource.value, PriceChange.product == product
            )
        )
        if touched is None:
            prices.set_price(session, admin, resource=resource, product=product, rate=rate)


def ensure_demo_credit(session: Session, admin: User, user: User) -> int:
    """Tops the demo user up once; returns the balance now (micro-yuan)."""
    billing.top_up(
        session,
        admin,
        user_id=user.id,
        amount=DEMO_CREDIT,
        note="demo credit",
        idempotency_key=DEMO_CREDIT_KEY,
    )
    return ledger.balance(session, ledger.account_key(ledger.USER_CASH, user.id))
