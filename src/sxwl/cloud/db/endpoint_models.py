"""The endpoints' tables (docs/endpoints.md): an endpoint as its user asked for it, its replicas
(each an ordinary job of the endpoint kind), the tokens its answers counted per key and day, and the
inference keys (``sk-…``) that call endpoints."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from sxwl.cloud.db.models import Base, partial_unique
from sxwl.cloud.db.types import UTCDateTime, utcnow


class Endpoint(Base):
    """``stopped_at`` set: deleted by its user (its replicas were cancelled); its name is free again."""

    __tablename__ = "endpoints"
    __table_args__ = (
        Index("ix_endpoints_owner_created", "owner_id", "created_at"),
        partial_unique("uq_endpoints_owner_name", "owner_id", "name", where="stopped_at IS NULL"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # "ep-…"
    owner_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(63))
    model_name: Mapped[str] = mapped_column(String(200))  # what the user asked for
    base_model_id: Mapped[str] = mapped_column(ForeignKey("catalog_models.id", ondelete="RESTRICT"))
    adapter_id: Mapped[str | None] = mapped_column(ForeignKey("catalog_models.id", ondelete="RESTRICT"))
    gpu_product: Mapped[str | None] = mapped_column(String(128))
    gpus: Mapped[int] = mapped_column(Integer)
    replicas: Mapped[int] = mapped_column(Integer)
    max_model_len: Mapped[int | None] = mapped_column(Integer)
    engine_args: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # The first time every replica served: after it, a replica short is "degraded", not "deploying".
    ready_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    stopped_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class EndpointReplica(Base):
    __tablename__ = "endpoint_replicas"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    endpoint_id: Mapped[str] = mapped_column(ForeignKey("endpoints.id", ondelete="CASCADE"), index=True)
    replica: Mapped[int] = mapped_column(Integer)  # 0-based, as the user counts them from 1


class EndpointUsage(Base):
    """Requests and tokens an endpoint answered, per credential and UTC day: ``key_id`` '' for a
    user's own token."""

    __tablename__ = "endpoint_usage"

    endpoint_id: Mapped[str] = mapped_column(ForeignKey("endpoints.id", ondelete="CASCADE"), primary_key=True)
    key_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    day: Mapped[str] = mapped_column(String(10), primary_key=True)  # YYYY-MM-DD
    requests: Mapped[int] = mapped_column(BigInteger, default=0)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0)


class InferenceKey(Base):
    """A key that calls its owner's endpoints (and nothing else): stored as the SHA-256 of the
    high-entropy secret (shown once), named, revocable, with optional limits: requests and tokens per
    minute, and a monthly spend cap in micro-yuan (migration 0019)."""

    __tablename__ = "inference_keys"
    __table_args__ = (Index("ix_inference_keys_owner_created", "owner_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # "key-…"
    owner_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(100))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(12))  # the secret's start, to tell keys apart
    rpm: Mapped[int | None] = mapped_column(Integer)
    tpm: Mapped[int | None] = mapped_column(Integer)
    monthly_cap: Mapped[int | None] = mapped_column(BigInteger)  # micro-yuan
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class InferenceKeyTokens(Base):
    """The tokens one answer to a key counted, kept for a minute: the key's tokens-per-minute
    window, in the database so that every replica reads the same one (migration 0019)."""

    __tablename__ = "inference_key_tokens"
    __table_args__ = (Index("ix_inference_key_tokens_key_at", "key_id", "at"),)

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    key_id: Mapped[str] = mapped_column(ForeignKey("inference_keys.id", ondelete="CASCADE"))
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    tokens: Mapped[int] = mapped_column(BigInteger)
