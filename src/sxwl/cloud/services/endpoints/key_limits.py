"""An inference key's tokens per minute and monthly spend (docs/endpoints.md, "Keys"), both read
from the database, so that every replica of the cloud enforces the same limits.

Tokens: each answer's tokens (prompt + completion, as the engine counted them) are kept for a minute
in ``inference_key_tokens``; a request is let through while the last minute's sum is below the
limit. Its own tokens are known only once it is answered, so one long answer may go past the limit;
the requests after it then wait until the window falls back below.

Spend: an endpoint's cost is what its replicas were billed (usage lines rated this UTC month, the
ledger's exact integers); a key is attributed the share of each endpoint's month cost that its
tokens are of all the tokens that endpoint answered this month (its requests' share where the
engine counted no tokens). The shares of every caller of an endpoint add up to no more than its
cost, and a key that alone calls an endpoint carries all of it, idle time included: that endpoint
runs for it."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, case, delete, func, insert, select
from sqlalchemy.orm import Session

from sxwl.cloud.db.endpoint_models import (
    Endpoint,
    EndpointReplica,
    EndpointUsage,
    InferenceKey,
    InferenceKeyTokens,
)
from sxwl.cloud.db.money_models import LedgerTransaction, UsageLine
from sxwl.cloud.errors import AppError
from sxwl.protocol.money import money_text

WINDOW = timedelta(seconds=60)


def month_start(now: datetime) -> datetime:
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def next_month(now: datetime) -> datetime:
    start = month_start(now)
    return (start + timedelta(days=32)).replace(day=1)


def over_limit(limit: str, message: str, retry_s: int, **details: object) -> AppError:
    """The 429 of one of a key's limits: ``limit`` (rpm, tpm, monthly_cap) names it in the code."""
    retry = max(1, retry_s)
    return AppError(
        429,
        f"{message}; try again in {retry} s",
        code=f"{limit}_exceeded",
        details={"limit": limit, "retry_after_s": retry, **details},
        headers={"Retry-After": str(retry)},
    )


def record_tokens(session: Session, key_id: str, tokens: int, now: datetime) -> None:
    """Adds one answer's tokens to the key's window, and drops what has left it."""
    session.execute(delete(InferenceKeyTokens).where(_key(key_id), InferenceKeyTokens.at <= now - WINDOW))
    if tokens > 0:
        session.execute(insert(InferenceKeyTokens).values(key_id=key_id, at=now, tokens=tokens))


def tokens_last_minute(session: Session, key_id: str, now: datetime) -> int:
    live = select(func.coalesce(func.sum(InferenceKeyTokens.tokens), 0)).where(
        _key(key_id), InferenceKeyTokens.at > now - WINDOW
    )
    return int(session.scalar(live) or 0)


def _tokens_refusal(session: Session, key: InferenceKey, now: datetime) -> AppError | None:
    if key.tpm is None:
        return None
    events = session.execute(
        select(InferenceKeyTokens.at, InferenceKeyTokens.tokens)
        .where(_key(key.id), InferenceKeyTokens.at > now - WINDOW)
        .order_by(InferenceKeyTokens.at)
    ).all()
    total = sum(tokens for _, tokens in events)
    if total < key.tpm:
        return None
    # The wait: until enough of the oldest answers leave the window to bring it below the limit.
    wait = int(WINDOW.total_seconds())
    for at, tokens in events:
        total -= tokens
        if total < key.tpm:
            wait = math.ceil((at + WINDOW - now).total_seconds())
            break
    return over_limit(
        "tpm",
        f"this key's {key.tpm} tokens per minute are used",
        wait,
        tokens_last_minute=sum(t for _, t in events),
    )


def spent_this_month(session: Session, key: InferenceKey, now: datetime) -> int:
    """Micro-yuan of its endpoints' cost this UTC month attributed to ``key`` (module doc)."""
    first_day = month_start(now).strftime("%Y-%m-%d")  # days as YYYY-MM-DD sort as dates
    mine = EndpointUsage.key_id == key.id
    weight = EndpointUsage.prompt_tokens + EndpointUsage.completion_tokens
    # The owner's endpoints (a few), so that each is read by its primary key's prefix.
    owned = select(Endpoint.id).where(Endpoint.owner_id == key.owner_id)
    shares = session.execute(
        select(
            EndpointUsage.endpoint_id,
            func.sum(case((mine, weight), else_=0)),
            func.sum(weight),
            func.sum(case((mine, EndpointUsage.requests), else_=0)),
            func.sum(EndpointUsage.requests),
        )
        .where(EndpointUsage.endpoint_id.in_(owned), EndpointUsage.day >= first_day)
        .group_by(EndpointUsage.endpoint_id)
    ).all()
    shares = [row for row in shares if row[1] or row[3]]  # the endpoints this key called
    if not shares:
        return 0
    costs = dict(
        session.execute(
            select(EndpointReplica.endpoint_id, func.sum(UsageLine.gross))
            .join(UsageLine, UsageLine.job_id == EndpointReplica.job_id)
            .join(LedgerTransaction, LedgerTransaction.id == UsageLine.transaction_id)
            .where(
                EndpointReplica.endpoint_id.in_([row[0] for row in shares]),
                LedgerTransaction.created_at >= month_start(now),
            )
            .group_by(EndpointReplica.endpoint_id)
        ).all()
    )
    spent = 0
    for endpoint_id, my_tokens, all_tokens, my_requests, all_requests in shares:
        cost = int(costs.get(endpoint_id) or 0)
        part, whole = (my_tokens, all_tokens) if all_tokens else (my_requests, all_requests)
        if whole:
            spent += cost * int(part) // int(whole)  # floor: the shares never add up past the cost
    return spent


def _cap_refusal(session: Session, key: InferenceKey, now: datetime) -> AppError | None:
    if key.monthly_cap is None:
        return None
    spent = spent_this_month(session, key, now)
    if spent < key.monthly_cap:
        return None
    wait = math.ceil((next_month(now) - now).total_seconds())
    message = f"this key's monthly spend cap of ¥{money_text(key.monthly_cap)} is reached"
    return over_limit("monthly_cap", message, wait, spent=spent, monthly_cap=key.monthly_cap)


def refusal(session: Session, key: InferenceKey, now: datetime) -> AppError | None:
    """The 429 of the key's tokens-per-minute limit or monthly cap, whichever it is past; None when
    it may call (its requests-per-minute limit is counted apart: ``inference_keys.admit``)."""
    return _tokens_refusal(session, key, now) or _cap_refusal(session, key, now)


def _key(key_id: str) -> ColumnElement[bool]:
    return InferenceKeyTokens.key_id == key_id
