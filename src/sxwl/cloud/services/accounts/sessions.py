"""Bearer tokens and console sessions: created on login, looked up by hash, revoked on logout."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from sxwl.cloud.db.models import AuthSession, SessionKind, User
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.kit.notify import on_commit
from sxwl.cloud.kit.security import SESSION_TOKEN_PREFIX, new_token, token_hash


def start(session: Session, user: User, kind: SessionKind, ttl_s: int) -> str:
    """Creates a session and returns its token; only the token's hash is stored."""
    token = new_token(SESSION_TOKEN_PREFIX)
    session.add(
        AuthSession(
            user_id=user.id,
            token_hash=token_hash(token),
            kind=kind,
            expires_at=utcnow() + timedelta(seconds=ttl_s),
        )
    )
    return token


def resolve(session: Session, token: str, kind: SessionKind) -> tuple[AuthSession, User] | None:
    row = session.execute(
        select(AuthSession, User)
        .join(User, AuthSession.user_id == User.id)
        .where(AuthSession.token_hash == token_hash(token), AuthSession.kind == kind)
    ).first()
    if row is None:
        return None
    auth, user = row
    if auth.revoked_at is not None or auth.expires_at <= utcnow():
        return None
    return auth, user


def revoke(session: Session, auth: AuthSession) -> None:
    auth.revoked_at = utcnow()
    on_commit(session).user_changed(auth.user_id)  # a process that remembers the token forgets it


def revoke_all(session: Session, user: User) -> None:
    session.execute(
        update(AuthSession)
        .where(AuthSession.user_id == user.id, AuthSession.revoked_at.is_(None))
        .values(revoked_at=utcnow())
    )
    on_commit(session).user_changed(user.id)
