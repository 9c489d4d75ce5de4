"""Inference keys (docs/endpoints.md, "Keys"): ``sk-…`` secrets that call their owner's endpoints
through /v1 and nothing else. Shown once, stored as their SHA-256 (invariant 2, docs/architecture.md:
a key is a credential of its own, revocable without touching the others), named, revocable, each with
an optional requests-per-minute limit counted in the database, so it holds across replicas."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.endpoint_models import InferenceKey
from sxwl.cloud.db.models import Role, User
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.errors import AppError
from sxwl.cloud.kit.ratelimit import RateLimiter
from sxwl.cloud.kit.security import new_token, token_hash

PREFIX = "sk-"
MAX_KEYS = 100  # live keys per user


@dataclass(frozen=True)
class Created:
    key: InferenceKey
    secret: str  # shown once, never stored


def create(session: Session, owner: User, name: str, rpm: int | None) -> Created:
    if owner.role == Role.PROVIDER:
        raise AppError(403, "inference keys call endpoints, which compute users (算力用户) deploy")
    live = session.scalars(
        select(InferenceKey.id).where(InferenceKey.owner_id == owner.id, InferenceKey.revoked_at.is_(None))
    ).all()
    if len(live) >= MAX_KEYS:
        raise AppError(409, f"you have {MAX_KEYS} keys; revoke one first", code="conflict")
    secret = new_token(PREFIX)
    key = InferenceKey(
        id=f"key-{secrets.token_hex(10)}",
        owner_id=owner.id,
        name=name,
        token_hash=token_hash(secret),
        prefix=secret[:10],
        rpm=rpm,
    )
    session.add(key)
    session.flush()
    return Created(key, secret)


def list_for(session: Session, owner: User) -> list[InferenceKey]:
    stmt = select(InferenceKey).where(InferenceKey.owner_id == owner.id)
    return list(session.scalars(stmt.order_by(InferenceKey.created_at.desc(), InferenceKey.id.desc())))


def revoke(session: Session, owner: User, key_id: str) -> InferenceKey:
    key = session.get(InferenceKey, key_id)
    if key is None or key.owner_id != owner.id:
        raise AppError(404, f"no key {key_id}")
    if key.revoked_at is None:
        key.revoked_at = utcnow()
    return key


def resolve(session: Session, secret: str) -> tuple[User, InferenceKey] | None:
    """The owner and the key of a live key's secret, or None (unknown or revoked)."""
    row = session.execute(
        select(User, InferenceKey)
        .join(InferenceKey, InferenceKey.owner_id == User.id)
        .where(InferenceKey.token_hash == token_hash(secret), InferenceKey.revoked_at.is_(None))
    ).one_or_none()
    return None if row is None else (row[0], row[1])


def admit(ctx: CloudContext, key_id: str, rpm: int | None) -> None:
    """Counts one request against the key's limit; 429 (with Retry-After) past it."""
    if rpm is not None:
        RateLimiter("inference-key", f"{rpm}/60", "requests with this key", ctx.db, ctx.box).hit(key_id)
