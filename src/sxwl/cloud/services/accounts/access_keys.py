"""A provider's accessKey: one active at a time, shown again on request, rotated at once."""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import AccessKey, Role, User
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.errors import AppError
from sxwl.cloud.kit.security import ACCESS_KEY_PREFIX, new_token, token_hash


def _require_provider(user: User) -> None:
    if user.role != Role.PROVIDER:
        raise AppError(403, "only compute providers (算力源) have an accessKey", code="not_a_provider")


def active(session: Session, user: User) -> AccessKey | None:
    return session.scalar(
        select(AccessKey).where(AccessKey.user_id == user.id, AccessKey.revoked_at.is_(None))
    )


def issue(ctx: CloudContext, session: Session, user: User, actor: User) -> str:
    """A new active key. The database keeps one active key per provider (uq_access_keys_one_active):
    if another request issued one at the same moment, this one is refused and changes nothing."""
    _require_provider(user)
    key = new_token(ACCESS_KEY_PREFIX)
    session.add(
        AccessKey(
            user_id=user.id,
            key_hash=token_hash(key),
            key_encrypted=ctx.box.encrypt(key),
            hint=key[-4:],
            created_by_id=actor.id,
        )
    )
    try:
        session.flush()
    except IntegrityError:
        raise AppError(
            409,
            "another accessKey was issued for this account at the same moment; "
            "it is the current one: show it again, or rotate once more",
            code="access_key_conflict",
        ) from None
    return key


def reveal(ctx: CloudContext, session: Session, user: User) -> str:
    _require_provider(user)
    current = active(session, user)
    if current is None:
        # A provider always has a key; one created before keys existed gets one now.
        return issue(ctx, session, user, actor=user)
    return ctx.box.decrypt(current.key_encrypted)


def rotate(ctx: CloudContext, session: Session, user: User, actor: User) -> str:
    """Revokes the active key and issues a new one in the same transaction.

    Concurrent rotations end as if they ran one after another: each revokes whatever key is active
    when it writes. On PostgreSQL they queue on the provider's row (NO KEY UPDATE, so that a
    registration's foreign-key check on it does not wait, which could deadlock with the registration's
    lock on the key); on SQLite the revocation is one conditional UPDATE, which runs under the
    database's write lock and so sees every rotation committed before it."""
    _require_provider(user)
    session.execute(select(User.id).where(User.id == user.id).with_for_update(key_share=True))
    session.execute(
        update(AccessKey)
        .where(AccessKey.user_id == user.id, AccessKey.revoked_at.is_(None))
        .values(revoked_at=utcnow(), revoked_by_id=actor.id)
    )
    return issue(ctx, session, user, actor)


def history(session: Session, user: User) -> list[AccessKey]:
    return list(
        session.scalars(
            select(AccessKey).where(AccessKey.user_id == user.id).order_by(AccessKey.created_at.desc())
        )
    )
