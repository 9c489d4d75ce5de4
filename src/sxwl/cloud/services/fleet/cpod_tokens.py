"""The CPod token rule, in one place for the three readers that each need it fast: the ORM read of
an agent call's CPod (cpods.authenticate), the long-poll renewal's one-column read (api/agent/routes.py)
and the heartbeat batch's prebuilt Core statement (heartbeats.py). A token names the live CPod
whose stored hash is its hash and that is not revoked; what does not look like a CPod token is
never hashed nor looked up; a refused one is told why (invariant 2, docs/architecture.md)."""

from __future__ import annotations

from sqlalchemy import BindParameter, ColumnElement, Select, select
from sqlalchemy.orm import Session

from sxwl.cloud.db.models import CPod, SessionKind
from sxwl.cloud.errors import AppError
from sxwl.cloud.kit.security import token_hash
from sxwl.cloud.services.accounts import sessions

PREFIX = "sxcp_"
_CPODS = CPod.__table__


def hash_of(token: str) -> str | None:
    """The hash a CPod token is stored under; None for what is not a CPod token at all."""
    return token_hash(token) if token.startswith(PREFIX) else None


def live(hashes: str | BindParameter[list[str]]) -> tuple[ColumnElement[bool], ...]:
    """What selects the live CPods holding ``hashes``: one hash, or an expanding parameter of
    several (the heartbeat batch's statement, built once)."""
    held = (
        _CPODS.c.token_hash.in_(hashes)
        if isinstance(hashes, BindParameter)
        else _CPODS.c.token_hash == hashes
    )
    return held, _CPODS.c.revoked_at.is_(None)


def id_query(token: str) -> Select[str] | None:
    """The read of the id of this token's live CPod, in one statement and no ORM (what a long-poll
    renewal needs); None for what is not a CPod token at all."""
    hashed = hash_of(token)
    return None if hashed is None else select(_CPODS.c.id).where(*live(hashed))


def required(token: str | None) -> str:
    if token is None:
        raise AppError(401, "CPod token required", headers={"WWW-Authenticate": "Bearer"})
    return token


def refusal(session: Session, token: str) -> AppError:
    """Why ``token``, which belongs to no live CPod, is refused."""
    if sessions.resolve(session, token, SessionKind.API) is not None:
        return AppError(403, "agent endpoints take a CPod token, not a user's", code="not_a_cpod")
    return AppError(
        401,
        "CPod token is not valid: the CPod was revoked or registered again elsewhere",
        code="cpod_revoked",
        headers={"WWW-Authenticate": "Bearer"},
    )
