"""Who is calling: bearer token (CLI, scripts) or console cookie (browser, CSRF-checked)."""

from __future__ import annotations

import hmac
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import AuthSession, Role, SessionKind, User
from sxwl.cloud.errors import AppError, invalid
from sxwl.cloud.services.accounts import sessions
from sxwl.protocol.fields import refuse_nul

SESSION_COOKIE = "sxwl_session"
CSRF_COOKIE = "sxwl_csrf"
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


async def get_ctx(request: Request) -> CloudContext:
    ctx: CloudContext = request.app.state.ctx
    return ctx


Ctx = Annotated[CloudContext, Depends(get_ctx)]


@dataclass(frozen=True)
class Principal:
    user: User
    auth: AuthSession


def csrf_ok(request: Request, submitted: str | None) -> bool:
    """Double-submit check: the token in the form or header must equal the CSRF cookie."""
    cookie = request.cookies.get(CSRF_COOKIE)
    return bool(cookie and submitted and hmac.compare_digest(cookie, submitted))


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def console_principal(ctx: CloudContext, request: Request) -> Principal | None:
    token = request.cookies.get(SESSION_COOKIE)
    if not token:
        return None
    with ctx.db.session() as session:
        found = sessions.resolve(session, token, SessionKind.CONSOLE)
    return Principal(found[1], found[0]) if found else None


def current_principal(request: Request, ctx: Ctx) -> Principal:
    token = bearer_token(request)
    if token is not None:
        with ctx.db.session() as session:
            found = sessions.resolve(session, token, SessionKind.API)
        if found is None:
            raise AppError(
                401,
                "token is invalid, expired or revoked; sign in again",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return Principal(found[1], found[0])
    principal = console_principal(ctx, request)
    if principal is None:
        raise AppError(401, "sign in required", headers={"WWW-Authenticate": "Bearer"})
    if request.method not in SAFE_METHODS and not csrf_ok(request, request.headers.get(CSRF_HEADER)):
        raise AppError(403, "missing or wrong CSRF token", code="csrf")
    return principal


CurrentPrincipal = Annotated[Principal, Depends(current_principal)]


async def current_user(principal: CurrentPrincipal) -> User:
    return principal.user


CurrentUser = Annotated[User, Depends(current_user)]


async def current_admin(user: CurrentUser) -> User:
    if user.role != Role.ADMIN:
        raise AppError(403, "administrators only")
    return user


CurrentAdmin = Annotated[User, Depends(current_admin)]


def client_ip(request: Request) -> str:
    return request.client.host if request.client else "unknown"


Model = TypeVar("Model", bound=BaseModel)


async def json_body(request: Request, model: type[Model]) -> Model:
    """The body parsed by pydantic straight from the bytes: for the large bodies of hot agent
    endpoints this costs a fraction of FastAPI's ``json.loads`` followed by validation of the Python
    objects. Errors are the same 422 as for declared bodies."""
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False)) from None


class PlainRoute(APIRoute):
    """A route whose endpoint takes only the Request and returns a Response, called as it is: no
    dependency solving, no response validation. For the hottest endpoints (heartbeats, long-poll
    renewals), where that machinery cost more than the endpoint's own work; their OpenAPI entries
    are still FastAPI's."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler: Callable[[Request], Coroutine[Any, Any, Response]] = self.endpoint
        return handler


def documented_body(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI for a body read with :func:`json_body` (FastAPI documents only declared ones); the
    app adds ``model``'s schema to the components (``app.document_bodies``)."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


async def plain_parameters(request: Request) -> None:
    """Path and query values reach SQL as text: NUL, which PostgreSQL cannot take, is a 422 naming
    the parameter, never a driver error."""
    for name, value in [*request.path_params.items(), *request.query_params.multi_items()]:
        if isinstance(value, str):
            try:
                refuse_nul(value)
            except ValueError as exc:
                raise invalid(name, str(exc)) from None
