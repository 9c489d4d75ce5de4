"""CPods as their providers (and admins) see them; GPU availability for everyone signed in."""

from __future__ import annotations

from fastapi import APIRouter, Response

from sxwl.cloud.api.deps import Ctx, CurrentUser
from sxwl.cloud.api.responses import SIGNED_IN, WITH_BODY, errors
from sxwl.cloud.api.schemas import CPodEventOut, CPodOut, CPodRenameIn, InputCacheOut
from sxwl.cloud.db.models import CPod
from sxwl.cloud.services.fleet import cpods
from sxwl.cloud.services.money.gpu_summary import GpuAvailability, GpuSummary, summarize
from sxwl.protocol import Node
from sxwl.protocol.reasons import english

router = APIRouter(tags=["cpods"], responses=SIGNED_IN)
NOT_FOUND = errors(404)


def cpod_out(cpod: CPod, owner_email: str) -> CPodOut:
    return CPodOut(
        id=cpod.id,
        name=cpod.name,
        owner_email=owner_email,
        status=cpod.status.value,
        revoked=cpod.revoked_at is not None,
        runtime=cpod.runtime,
        isolation=cpod.isolation,
        fine_tunes=cpod.takes_fine_tunes,
        input_cache=InputCacheOut(entries=len(cpod.cached_inputs), bytes=cpods.cached_bytes(cpod)),
        agent_version=cpod.agent_version,
        created_at=cpod.created_at,
        last_heartbeat_at=cpod.last_heartbeat_at,
        heartbeat_interval_s=cpod.heartbeat_interval_s,
        nodes=[Node.model_validate(n) for n in cpod.nodes],
        gpu_summary=summarize(cpod.nodes),
    )


@router.get("/cpods", response_model=list[CPodOut])
def list_cpods(user: CurrentUser, ctx: Ctx) -> list[CPodOut]:
    """A provider's own CPods; every CPod, with its owner, for an admin."""
    with ctx.db.session() as session:
        return [cpod_out(cpod, email) for cpod, email in cpods.list_for(session, user)]


@router.get("/cpods/{cpod_id}", response_model=CPodOut, responses=NOT_FOUND)
def get_cpod(cpod_id: str, user: CurrentUser, ctx: Ctx) -> CPodOut:
    with ctx.db.session() as session:
        cpod = cpods.get_for(session, user, cpod_id)
        return cpod_out(cpod, cpod.owner.email)


@router.patch("/cpods/{cpod_id}", response_model=CPodOut, responses=WITH_BODY | NOT_FOUND)
def rename_cpod(cpod_id: str, body: CPodRenameIn, user: CurrentUser, ctx: Ctx) -> CPodOut:
    with ctx.db.session() as session:
        cpod = cpods.rename(session, user, cpod_id, body.name)
        return cpod_out(cpod, cpod.owner.email)


@router.delete("/cpods/{cpod_id}", status_code=204, responses=NOT_FOUND)
def revoke_cpod(cpod_id: str, user: CurrentUser, ctx: Ctx) -> Response:
    """Revokes the CPod's token: its agent's next call gets 401 and it stops."""
    with ctx.db.session() as session:
        cpods.revoke(session, user, cpod_id)
    return Response(status_code=204)


@router.get("/cpods/{cpod_id}/events", response_model=list[CPodEventOut], responses=NOT_FOUND)
def cpod_events(cpod_id: str, user: CurrentUser, ctx: Ctx) -> list[CPodEventOut]:
    with ctx.db.session() as session:
        cpods.get_for(session, user, cpod_id)
        return [
            CPodEventOut(at=e.at, kind=e.kind, detail=english(e.detail), actor=actor)
            for e, actor in cpods.events(session, cpod_id)
        ]


@router.get("/gpu-types", response_model=list[GpuAvailability])
def gpu_types(user: CurrentUser, ctx: Ctx) -> list[GpuSummary]:
    """Free GPUs per product over all online CPods; no CPod or provider is named."""
    with ctx.db.session() as session:
        return cpods.gpu_types(session)  # the response model keeps what users may see of them
