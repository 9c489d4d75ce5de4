"""The agent side: register with the accessKey, then everything with the per-CPod token."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request

from sxwl.cloud.api.deps import Ctx, bearer_token
from sxwl.cloud.api.schemas import AccessKeyCheckOut, CPodBriefOut
from sxwl.cloud.db.models import CPod, SessionKind
from sxwl.cloud.errors import AppError
from sxwl.cloud.services import cpods, sessions
from sxwl.protocol import (
    PROTOCOL_HEADER,
    PROTOCOL_VERSION,
    Heartbeat,
    HeartbeatReply,
    RegisterReply,
    RegisterRequest,
)
from sxwl.protocol.models import MIN_SUPPORTED_PROTOCOL

router = APIRouter(prefix="/agent", tags=["agent"])


def check_protocol(version: int | None) -> None:
    if version is not None and not MIN_SUPPORTED_PROTOCOL <= version <= PROTOCOL_VERSION:
        raise AppError(
            400,
            f"agent protocol {version} is not supported by this cloud (supports {MIN_SUPPORTED_PROTOCOL}"
            f"..{PROTOCOL_VERSION}); install a matching sxwl-agent",
            code="unsupported_protocol",
            details={"supported": [MIN_SUPPORTED_PROTOCOL, PROTOCOL_VERSION], "agent": version},
        )


def protocol_header(
    version: Annotated[int | None, Header(alias=PROTOCOL_HEADER)] = None,
) -> None:
    check_protocol(version)


def current_cpod(request: Request, ctx: Ctx, _: Annotated[None, Depends(protocol_header)]) -> CPod:
    token = bearer_token(request)
    if token is None:
        raise AppError(401, "CPod token required", headers={"WWW-Authenticate": "Bearer"})
    with ctx.db.session() as session:
        cpod = cpods.cpod_for_token(session, token)
        if cpod is None and sessions.resolve(session, token, SessionKind.API) is not None:
            raise AppError(403, "agent endpoints take a CPod token, not a user's", code="not_a_cpod")
    if cpod is None:
        raise AppError(
            401,
            "CPod token is not valid: the CPod was revoked or registered again elsewhere",
            code="cpod_revoked",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return cpod


CurrentCPod = Annotated[CPod, Depends(current_cpod)]


@router.post("/register", response_model=RegisterReply, dependencies=[Depends(protocol_header)])
def register(body: RegisterRequest, request: Request, ctx: Ctx) -> RegisterReply:
    """Exchanges the provider's accessKey for this CPod's own token (the accessKey is used only here)."""
    check_protocol(body.protocol_version)
    key = bearer_token(request)
    if key is None:
        raise AppError(401, "accessKey required as the bearer token", headers={"WWW-Authenticate": "Bearer"})
    cpod, token = cpods.register(ctx, key, body)
    return RegisterReply(
        cpod_id=cpod.id,
        cpod_token=token,
        heartbeat_interval_s=cpod.heartbeat_interval_s,
        last_seq=cpod.last_seq,
    )


@router.get("/access-key/check", response_model=AccessKeyCheckOut)
def check_access_key(request: Request, ctx: Ctx) -> AccessKeyCheckOut:
    """Lets deployment tools verify an accessKey before touching any host, and watch the provider's
    CPods come online, with nothing but the accessKey."""
    key = bearer_token(request)
    with ctx.db.session() as session:
        owner = cpods.provider_for_access_key(session, key or "")
        if owner is None:
            raise AppError(
                401,
                "accessKey is not valid (wrong, or rotated); copy the current one from the console",
                code="bad_access_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return AccessKeyCheckOut(
            provider=owner.email,
            cpods=[
                CPodBriefOut(id=c.id, name=c.name, status=c.status.value, revoked=c.revoked_at is not None)
                for c, _ in cpods.list_for(session, owner)
            ],
        )


@router.post("/heartbeat", response_model=HeartbeatReply)
def heartbeat(body: Heartbeat, cpod: CurrentCPod, ctx: Ctx) -> HeartbeatReply:
    if body.cpod_id is not None and body.cpod_id != cpod.id:
        raise AppError(403, "this token belongs to another CPod", code="wrong_cpod")
    with ctx.db.session() as session:
        return cpods.heartbeat(ctx, session, cpod, body)
