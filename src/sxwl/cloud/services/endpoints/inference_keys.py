"""Inference keys (docs/endpoints.md, "Keys"): ``sk-…`` secrets that call their owner's endpoints
through /v1 and nothing else. Shown once, stored as their SHA-256 (invariant 2, docs/architecture.md:
a key is a credential of its own, revocable without touching the others), named, revocable, each with
optional limits (requests and tokens per minute, a monthly spend cap: key_limits.py) counted in the
database, so they hold across replicas."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.endpoint_models import InferenceKey
from sxwl.cloud.db.models import Role, SessionKind, User
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.errors import AppError
from sxwl.cloud.kit.notify import on_commit
from sxwl.cloud.kit.ratelimit import RateLimiter
from sxwl.cloud.kit.security import new_token, token_hash
from sxwl.cloud.services.accounts import sessions
from sxwl.cloud.services.endpoints import key_limits
from sxwl.cloud.services.endpoints.call_cache import KnownCaller

PREFIX = "sk-"
MAX_KEYS = 100  # live keys per user


@dataclass(frozen=True)
class Limits:
    rpm: int | None = None
    tpm: int | None = None
    monthly_cap: int | None = None  # micro-yuan


@dataclass(frozen=True)
class Created:
    key: InferenceKey
    secret: str  # shown once, never stored


def create(session: Session, owner: User, name: str, limits: Limits) -> Created:
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
        rpm=limits.rpm,
        tpm=limits.tpm,
        monthly_cap=limits.monthly_cap,
    )
    session.add(key)
    session.flush()
    return Created(key, secret)


def list_for(session: Session, owner: User) -> list[InferenceKey]:
    stmt = select(InferenceKey).where(InferenceKey.owner_id == owner.id)
    return list(session.scalars(stmt.order_by(InferenceKey.created_at.desc(), InferenceKey.id.desc())))


def _owned(session: Session, owner: User, key_id: str) -> InferenceKey:
    key = session.get(InferenceKey, key_id)
    if key is None or key.owner_id != owner.id:
        raise AppError(404, f"no key {key_id}")
    return key


def change(session: Session, owner: User, key_id: str, changes: dict[str, int | None]) -> InferenceKey:
    """Sets the limits named in ``changes`` (rpm, tpm, monthly_cap; None lifts one); the next
    request is judged by them."""
    key = _owned(session, owner, key_id)
    if key.revoked_at is not None:
        raise AppError(409, f"key {key_id} is revoked", code="conflict")
    for field, value in changes.items():
        setattr(key, field, value)
    on_commit(session).user_changed(owner.id)  # processes that remember the key forget it
    return key


def revoke(session: Session, owner: User, key_id: str) -> InferenceKey:
    key = _owned(session, owner, key_id)
    if key.revoked_at is None:
        key.revoked_at = utcnow()
        on_commit(session).user_changed(owner.id)  # processes that remember the key forget it
    return key


def resolve(session: Session, secret: str) -> tuple[User, InferenceKey] | None:
    """The owner and the key of a live key's secret, or None (unknown or revoked)."""
    row = session.execute(
        select(User, InferenceKey)
        .join(InferenceKey, InferenceKey.owner_id == User.id)
        .where(InferenceKey.token_hash == token_hash(secret), InferenceKey.revoked_at.is_(None))
    ).one_or_none()
    return None if row is None else (row[0], row[1])


def known_caller(session: Session, secret: str) -> KnownCaller | None:
    """Who calls /v1 with ``secret`` (an ``sk-`` key, or a user's API token), detached from
    ``session``; None for a credential that is unknown, revoked or expired."""
    if secret.startswith(PREFIX):
        found = resolve(session, secret)
        if found is None:
            return None
        user, key = found
        session.expunge(user)
        session.expunge(key)
        return KnownCaller(user, key=key)
    signed_in = sessions.resolve(session, secret, SessionKind.API)
    if signed_in is None:
        return None
    auth, user = signed_in
    session.expunge(user)
    return KnownCaller(user, expires_at=auth.expires_at)


def limited(key: InferenceKey) -> bool:
    """Whether a call with ``key`` has a limit to be counted against (``admit``)."""
    return key.rpm is not None or key.tpm is not None or key.monthly_cap is not None


def admit(ctx: CloudContext, key: InferenceKey) -> None:
    """Lets one request of ``key`` through or raises the 429 (with Retry-After) of the limit it is
    past. Only a request let through counts against its requests per minute."""
    if key.tpm is not None or key.monthly_cap is not None:
        with ctx.db.session() as session:
            refused = key_limits.refusal(session, key, utcnow())
        if refused is not None:
            raise refused
    if key.rpm is not None:
        limiter = RateLimiter("inference-key", f"{key.rpm}/60", "requests with this key", ctx.db, ctx.box)
        taken = limiter.take(key.id)
        if isinstance(taken, AppError):
            retry = int((taken.headers or {}).get("Retry-After", "1"))
            raise key_limits.over_limit("rpm", f"this key's {key.rpm} requests per minute are used", retry)
