"""Who calls an endpoint through /v1 (docs/endpoints.md, "Keys"): an inference key (``sk-…``, its
limits counted: services/endpoints/key_limits.py) or the user's own token or console session.
Either way only the owner's endpoints answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool

from sxwl.cloud.api.deps import Ctx, bearer_token, current_principal
from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import User
from sxwl.cloud.errors import AppError
from sxwl.cloud.services.endpoints import inference_keys
from sxwl.cloud.services.endpoints.call_cache import KnownCaller


@dataclass(frozen=True)
class Caller:
    user: User
    key_id: str  # "" for the user's own token
    counts_tokens: bool = False  # the key has a tokens-per-minute limit: its answers' tokens count


def _resolved(ctx: CloudContext, token: str) -> KnownCaller:
    changes = ctx.calls.changes
    with ctx.db.session() as session:
        known = inference_keys.known_caller(session, token)
    if known is not None:
        ctx.calls.remember_caller(token, known, changes)
        return known
    if token.startswith(inference_keys.PREFIX):
        message = "this inference key is invalid or revoked"
    else:
        message = "token is invalid, expired or revoked; sign in again"
    raise AppError(401, message, headers={"WWW-Authenticate": "Bearer"})


async def _caller(request: Request, ctx: Ctx, count: bool) -> Caller:
    token = bearer_token(request)
    if token is None:  # the console's session (the Playground), with its CSRF check
        principal = await run_in_threadpool(current_principal, request, ctx)
        return Caller(principal.user, "")
    # A credential remembered a moment ago needs no thread: this is every call's path.
    known = ctx.calls.caller(token)
    if known is None:
        known = await run_in_threadpool(_resolved, ctx, token)
    if known.key is None:
        return Caller(known.user, "")
    if count and inference_keys.limited(known.key):
        await run_in_threadpool(inference_keys.admit, ctx, known.key)
    return Caller(known.user, known.key.id, known.key.tpm is not None)


async def counted_caller(request: Request, ctx: Ctx) -> Caller:
    return await _caller(request, ctx, count=True)


async def listing_caller(request: Request, ctx: Ctx) -> Caller:
    return await _caller(request, ctx, count=False)


InferenceCaller = Annotated[Caller, Depends(counted_caller)]
ListingCaller = Annotated[Caller, Depends(listing_caller)]
