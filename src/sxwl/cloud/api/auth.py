"""Registration, login and logout."""

from __future__ import annotations

from anyio import to_thread
from fastapi import APIRouter, Depends, Request, Response

from sxwl.cloud.api.deps import Ctx, CurrentPrincipal, client_ip
from sxwl.cloud.api.responses import WITH_BODY, errors, no_store
from sxwl.cloud.api.schemas import LoginIn, RegisterIn, TokenOut, UserOut
from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import Role, SessionKind, User
from sxwl.cloud.services.accounts import accounts, sessions

router = APIRouter(prefix="/auth", tags=["auth"], responses=WITH_BODY)


@router.post("/register", status_code=201, response_model=UserOut, responses=errors(409, 429))
def register(body: RegisterIn, request: Request, ctx: Ctx) -> UserOut:
    new = accounts.NewAccount(body.email, body.password, Role(body.role), body.name, body.company, body.phone)
    return UserOut.model_validate(accounts.register(ctx, client_ip(request), new))


@router.post("/login", response_model=TokenOut, responses=errors(401, 429), dependencies=[Depends(no_store)])
async def login(body: LoginIn, request: Request, ctx: Ctx) -> TokenOut:
    user = await accounts.sign_in(ctx, client_ip(request), body.email, body.password)
    token = await to_thread.run_sync(_start_session, ctx, user)
    return TokenOut(access_token=token, expires_in=ctx.settings.api_token_ttl_s)


def _start_session(ctx: CloudContext, user: User) -> str:
    with ctx.db.session() as session:
        return sessions.start(session, user, SessionKind.API, ctx.settings.api_token_ttl_s)


@router.post("/logout", status_code=204, responses=errors(401, 403))
def logout(principal: CurrentPrincipal, ctx: Ctx) -> Response:
    with ctx.db.session() as session:
        auth = session.merge(principal.auth)
        sessions.revoke(session, auth)
    return Response(status_code=204)
