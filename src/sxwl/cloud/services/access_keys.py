"""A provider's accessKey: one active at a time, shown again on request, rotated at once."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import AccessKey, Role, User
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.errors import AppError
from sxwl.cloud.security import ACCESS_KEY_PREFIX, new_token, token_hash


def _require_provider(user: User) -> None:
    if user.role != Role.PROVIDER:
        raise AppError(403, "only compute providers (算力源) have an accessKey", code="not_a_provider")


def active(session: Session, user: User) -> AccessKey | None:
    return session.scalar(
        select(AccessKey).where(AccessKey.user_id == user.id, AccessKey.revoked_at.is_(None))
    )


def issue(ctx: CloudContext, session: Session, user: User, actor: User) -> str:
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
    session.flush()
    return key


def reveal(ctx: CloudContext, session: Session, user: User) -> str:
    _require_provider(user)
    current = active(session, user)
    if current is None:
        # A provider always has a key; one created before keys existed gets one now.
        return issue(ctx, session, user, actor=user)
    return ctx.box.decrypt(current.key_encrypted)


def rotate(ctx: CloudContext, session: Session, user: User, actor: User) -> str:
    """Revokes the active key and issues a new one in the same transaction."""
    _require_provider(user)
    # Lock the user's row so two concurrent rotations cannot both leave a key active.
    session.execute(select(User.id).where(User.id == user.id).with_for_update())
    current = active(session, user)
    if current is not None:
        current.revoked_at = utcnow()
        current.revoked_by_id = actor.id
        session.flush()
    return issue(ctx, session, user, actor)


def history(session: Session, user: User) -> list[AccessKey]:
    return list(
        session.scalars(
            select(AccessKey).where(AccessKey.user_id == user.id).order_by(AccessKey.created_at.desc())
        )
    )
