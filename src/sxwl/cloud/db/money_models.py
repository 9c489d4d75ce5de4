"""The money tables (docs/billing.md): the price book, the double-entry ledger, usage lines and GPU
time offered."""

from __future__ import annotations

import enum
from datetime import datetime

from sqlalchemy import (
    BigInteger,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    PrimaryKeyConstraint,
    String,
)
from sqlalchemy.orm import Mapped, mapped_column

from sxwl.cloud.db.models import Base, new_id, str_enum
from sxwl.cloud.db.types import UTCDateTime, utcnow


class PriceResource(enum.StrEnum):
    GPU = "gpu"
    CPU = "cpu"
    # Saved dev environment workspaces: ``price_per_hour`` holds the price per GiB-day (docs/billing.md).
    STORAGE = "storage"


class Price(Base):
    """What users pay per unit-hour of a GPU product (or of a CPU core), and the platform's fee."""

    __tablename__ = "prices"

    resource: Mapped[PriceResource] = mapped_column(str_enum(PriceResource), primary_key=True)
    product: Mapped[str] = mapped_column(String(128), primary_key=True)  # "" for CPU cores
    price_per_hour: Mapped[int] = mapped_column(BigInteger)  # micro-yuan
    fee_bp: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_by_id: Mapped[str | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))


class PriceChange(Base):
    """Every price an admin set, kept: who, when, and what it was before."""

    __tablename__ = "price_changes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    resource: Mapped[str] = mapped_column(String(8))
    product: Mapped[str] = mapped_column(String(128))
    price_per_hour: Mapped[int | None] = mapped_column(BigInteger)  # None: the price was removed
    fee_bp: Mapped[int | None] = mapped_column(Integer)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    actor_id: Mapped[str | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))


class LedgerAccount(Base):
    """An account of the double-entry ledger; ``balance`` caches the sum of its entries."""

    __tablename__ = "ledger_accounts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)  # "<kind>:<owner id>" or "<kind>:"
    kind: Mapped[str] = mapped_column(String(24))
    owner_id: Mapped[str | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"), index=True)
    balance: Mapped[int] = mapped_column(BigInteger, default=0)


class LedgerTransaction(Base):
    """One movement of money; its entries sum to zero. A usage transaction is one batch of a
    metering pass for one payer and one provider; its usage lines say which attempts it charged."""

    __tablename__ = "ledger_transactions"
    __table_args__ = (
        Index("ix_ledger_tx_payer", "payer_id", "created_at"),
        Index("ix_ledger_tx_provider", "provider_id", "created_at"),
        Index("ix_ledger_tx_kind", "kind", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    idempotency_key: Mapped[str] = mapped_column(String(128), unique=True)
    kind: Mapped[str] = mapped_column(String(16))  # usage | top_up | release | payout
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    actor_id: Mapped[str | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    note: Mapped[str | None] = mapped_column(String(500))
    payer_id: Mapped[str | None] = mapped_column(String(32))
    provider_id: Mapped[str | None] = mapped_column(String(32))
    gross: Mapped[int] = mapped_column(BigInteger, default=0)
    fee: Mapped[int] = mapped_column(BigInteger, default=0)
    net: Mapped[int] = mapped_column(BigInteger, default=0)


class LedgerEntry(Base):
    __tablename__ = "ledger_entries"

    # Three entries per usage rating add up: 64-bit ids (SQLite's rowid is 64-bit already).
    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    transaction_id: Mapped[str] = mapped_column(
        ForeignKey("ledger_transactions.id", ondelete="RESTRICT"), index=True
    )
    account_id: Mapped[int] = mapped_column(ForeignKey("ledger_accounts.id", ondelete="RESTRICT"), index=True)
    amount: Mapped[int] = mapped_column(BigInteger)


class UsageLine(Base):
    """One attempt's slice of usage (microseconds since it started, from mark to mark) rated by a
    usage transaction; the primary key is the slice's idempotency key (docs/billing.md)."""

    __tablename__ = "usage_lines"
    __table_args__ = (
        PrimaryKeyConstraint("job_id", "attempt", "from_us", name="pk_usage_lines"),
        ForeignKeyConstraint(
            ["job_id", "attempt"],
            ["job_attempts.job_id", "job_attempts.attempt"],
            name="fk_usage_lines_attempt",
            ondelete="RESTRICT",
        ),
    )

    job_id: Mapped[str] = mapped_column(String(32))
    attempt: Mapped[int] = mapped_column(Integer)
    from_us: Mapped[int] = mapped_column(BigInteger)
    to_us: Mapped[int] = mapped_column(BigInteger)
    gross: Mapped[int] = mapped_column(BigInteger)  # the payer paid; the provider earned net
    net: Mapped[int] = mapped_column(BigInteger)  # of it, and the platform the rest
    transaction_id: Mapped[str] = mapped_column(
        ForeignKey("ledger_transactions.id", ondelete="RESTRICT", name="fk_usage_lines_transaction"),
        index=True,
    )


class StorageCharge(Base):
    """One dev environment's saved workspace charged for one UTC day (migration 0020): the primary
    key is the (environment, day), so a day is charged once whichever replica charges it."""

    __tablename__ = "storage_charges"
    __table_args__ = (
        PrimaryKeyConstraint("dev_env_id", "day", name="pk_storage_charges"),
        Index("ix_storage_charges_payer_day", "payer_id", "day"),
    )

    dev_env_id: Mapped[str] = mapped_column(String(32))
    day: Mapped[str] = mapped_column(String(10))  # YYYY-MM-DD, UTC
    payer_id: Mapped[str] = mapped_column(String(32))
    bytes: Mapped[int] = mapped_column(BigInteger)
    price_per_gib_day: Mapped[int] = mapped_column(BigInteger)  # micro-yuan, as it was that day
    gross: Mapped[int] = mapped_column(BigInteger)
    transaction_id: Mapped[str] = mapped_column(
        ForeignKey("ledger_transactions.id", ondelete="RESTRICT", name="fk_storage_charges_transaction")
    )


class GpuOffer(Base):
    """GPU time a CPod offered (its allocatable GPUs while online), per UTC day and product."""

    __tablename__ = "gpu_offers"

    cpod_id: Mapped[str] = mapped_column(ForeignKey("cpods.id", ondelete="CASCADE"), primary_key=True)
    day: Mapped[str] = mapped_column(String(10), primary_key=True)  # YYYY-MM-DD, UTC
    gpu_product: Mapped[str] = mapped_column(String(128), primary_key=True)
    gpu_us: Mapped[int] = mapped_column(BigInteger, default=0)  # GPU-microseconds
