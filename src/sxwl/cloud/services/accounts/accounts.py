"""Registration, login, passwords and the user list."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from anyio import to_thread
from email_validator import EmailNotValidError, validate_email
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from sxwl.cloud.context import CloudContext, Limiters
from sxwl.cloud.db.models import Role, User
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.errors import AppError, invalid
from sxwl.cloud.services.accounts import access_keys, sessions

MIN_PASSWORD = 8
MAX_PASSWORD = 1024


def normalize_email(text: str) -> str:
    """The canonical form that uniqueness is checked on: validated, whole address lower-cased."""
    try:
        result = validate_email(text.strip(), check_deliverability=False)
    except EmailNotValidError as exc:
        raise ValueError(str(exc)) from None
    return result.normalized.lower()


def check_password(password: str, field: str = "password") -> None:
    if len(password) < MIN_PASSWORD:
        raise invalid(field, f"must be at least {MIN_PASSWORD} characters")
    if len(password) > MAX_PASSWORD:
        raise invalid(field, f"must be at most {MAX_PASSWORD} characters")


@dataclass(frozen=True)
class NewAccount:
    email: str
    password: str
    role: Role
    name: str | None = None
    company: str | None = None
    phone: str | None = None


def find_by_email(session: Session, email: str) -> User | None:
    return session.scalar(select(User).where(User.email == email))


def _email_taken() -> AppError:
    return AppError(
        409,
        "an account with this email already exists",
        code="email_taken",
        details=[{"field": "email", "message": "already registered"}],
    )


def create_user(ctx: CloudContext, session: Session, new: NewAccount, created_by: User | None = None) -> User:
    """Creates the account (and a provider's accessKey). The email must already be normalised."""
    check_password(new.password)
    if find_by_email(session, new.email) is not None:
        raise _email_taken()
    user = User(
        email=new.email,
        password_hash=ctx.passwords.hash(new.password),
        role=new.role,
        name=new.name,
        company=new.company if new.role == Role.PROVIDER else None,
        phone=new.phone,
    )
    session.add(user)
    try:
        session.flush()
    except IntegrityError:
        # The same email registered by a concurrent request after the check above.
        raise _email_taken() from None
    if user.role == Role.PROVIDER:
        access_keys.issue(ctx, session, user, actor=created_by or user)
    return user


def authenticate(ctx: CloudContext, session: Session, email: str, password: str) -> User:
    """The user for these credentials; one indistinguishable 401 for unknown email or wrong password."""
    try:
        normalized = normalize_email(email)
    except ValueError:
        normalized = None
    user = find_by_email(session, normalized) if normalized else None
    if not ctx.passwords.verify(user.password_hash if user else None, password) or user is None:
        raise AppError(401, "email or password is incorrect", code="bad_credentials")
    return user


def rate_key(email: str) -> str:
    """The per-account rate-limit key: the normalised email, or the raw text when it is not one."""
    try:
        return normalize_email(email)
    except ValueError:
        return email.strip().lower()


async def sign_in(ctx: CloudContext, client_ip: str, email: str, password: str) -> User:
    """The password check under the login policy of docs/operations.md: only failures count, per
    source address and per account. A source over its limit is refused before any check; an account
    over its limit still lets the right password in, after a delay, and answers a wrong one with
    429. The delay is awaited, not slept in a worker thread that other requests need.

    An attempt counts as a failure from the moment it starts until it succeeds, so that attempts made
    at once, on any replicas, never get more password checks than the limits allow."""
    limits = ctx.limiters
    account = rate_key(email)
    attempt, taken = await to_thread.run_sync(_admit, limits, client_ip, account)
    locked = taken if isinstance(taken, AppError) else None
    if locked is not None:
        await asyncio.sleep(ctx.settings.login_locked_delay_s)
    try:
        user = await to_thread.run_sync(_authenticate, ctx, email, password)
    except AppError as exc:
        if locked is None:
            raise
        raise await to_thread.run_sync(_failed_while_locked, limits, account) or locked from exc
    await to_thread.run_sync(_succeeded, limits, attempt, account)
    return user


def _admit(limits: Limiters, client_ip: str, account: str) -> tuple[int, int | AppError]:
    """Counts the attempt against its address (429 when that is full) and takes a place in its
    account's window, or the account's 429 when that is full."""
    return limits.login_ip.hit(client_ip), limits.login_account.take(account)


def _failed_while_locked(limits: Limiters, account: str) -> AppError | None:
    limits.login_account.record(account)
    return limits.login_account.refusal(account)


def _succeeded(limits: Limiters, attempt: int, account: str) -> None:
    limits.login_ip.release(attempt)
    limits.login_account.clear(account)


def _authenticate(ctx: CloudContext, email: str, password: str) -> User:
    with ctx.db.session() as session:
        return authenticate(ctx, session, email, password)


def register(ctx: CloudContext, client_ip: str, new: NewAccount) -> User:
    """Rate-limited self-service registration."""
    ctx.limiters.register_ip.hit(client_ip)
    ctx.limiters.register_account.hit(new.email)
    with ctx.db.session() as session:
        return create_user(ctx, session, new)


def change_password(ctx: CloudContext, session: Session, user: User, current: str, new: str) -> None:
    if not ctx.passwords.verify(user.password_hash, current):
        raise invalid("current_password", "is incorrect")
    check_password(new, "new_password")
    user.password_hash = ctx.passwords.hash(new)
    user.password_changed_at = utcnow()
    sessions.revoke_all(session, user)


def set_password(ctx: CloudContext, session: Session, user: User, new: str) -> None:
    """An administrative reset: no current password, every session of the user ends."""
    check_password(new)
    user.password_hash = ctx.passwords.hash(new)
    user.password_changed_at = utcnow()
    sessions.revoke_all(session, user)


@dataclass(frozen=True)
class UserPage:
    items: list[User]
    total: int
    page: int
    per_page: int

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.per_page))


def list_users(
    session: Session, page: int, per_page: int, role: Role | None = None, query: str = ""
) -> UserPage:
    stmt = select(User)
    if role is not None:
        stmt = stmt.where(User.role == role)
    if query:
        stmt = stmt.where(User.email.contains(query.strip().lower(), autoescape=True))
    total = session.scalar(select(func.count()).select_from(stmt.subquery())) or 0
    items = session.scalars(
        stmt.order_by(User.created_at.desc(), User.id).offset((page - 1) * per_page).limit(per_page)
    ).all()
    return UserPage(list(items), total, page, per_page)


def set_max_gpus(session: Session, user_id: str, max_gpus: int | None) -> User:
    user = session.get(User, user_id)
    if user is None:
        raise AppError(404, f"no user {user_id}")
    user.max_gpus = max_gpus
    return user
