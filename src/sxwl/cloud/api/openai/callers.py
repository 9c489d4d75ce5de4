"""Who calls an endpoint through /v1 (docs/endpoints.md, "Keys"): an inference key (``sk-…``, its
limits counted: services/endpoints/key_limits.py) or the user's own token or console session.
Either way only the owner's endpoints answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool

from sxwl.cloud.api.deps import Ctx, bearer_token, current_principal
from sxwl.cloud.db.models import User
from sxwl.cloud.errors import AppError
from sxwl.cloud.services.endpoints import inference_keys


@dataclass(frozen=True)
class Caller:
    user: User
    key_id: str  # "" for the user's own token
    counts_tokens: bool = False  # the key has a tokens-per-minute limit: its answers' tokens count


async def _caller(request: Request, ctx: Ctx, count: bool) -> Caller:
    token = bearer_token(request)
    if token is None or not token.startswith(inference_keys.PREFIX):
        principal = await run_in_threadpool(current_principal, request, ctx)
        return Caller(principal.user, "")

    def resolve() -> Caller:
        with ctx.db.session() as session:
            found = inference_keys.resolve(session, token)
            if found is not None:
                session.expunge(found[0])
        if found is None:
            raise AppError(
                401, "this inference key is invalid or revoked", headers={"WWW-Authenticate": "Bearer"}
            )
        user, key = found
        if count:
            inference_keys.admit(ctx, key)
        return Caller(user, key.id, key.tpm is not None)

    return await run_in_threadpool(resolve)


async def counted_caller(request: Request, ctx: Ctx) -> Caller:
    return await _caller(request, ctx, count=True)


async def listing_caller(request: Request, ctx: Ctx) -> Caller:
    return await _caller(request, ctx, count=False)


InferenceCaller = Annotated[Caller, Depends(counted_caller)]
ListingCaller = Annotated[Caller, Depends(listing_caller)]
