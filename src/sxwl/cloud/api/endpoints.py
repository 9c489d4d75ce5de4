"""Endpoints as their users see them (docs/endpoints.md): deploy, list, look, delete, and the
engine's log (a replica's job's log)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import RedirectResponse
from pydantic import BaseModel
from sqlalchemy.orm import Session

from sxwl.cloud.api.deps import Ctx, CurrentUser
from sxwl.cloud.api.responses import SIGNED_IN, WITH_BODY, errors
from sxwl.cloud.db.models import Job
from sxwl.cloud.services.endpoints import endpoints, routing
from sxwl.cloud.services.fleet.engine_loads import EngineLoads
from sxwl.protocol import paths
from sxwl.protocol.endpoints import EndpointRequest
from sxwl.protocol.fields import NonNegInt64, PosInt32
from sxwl.protocol.reasons import english

router = APIRouter(prefix="/endpoints", tags=["endpoints"], responses=SIGNED_IN)
NOT_FOUND = errors(404)


class LoadOut(BaseModel):
    """A serving replica's engine load as its CPod's last heartbeat said (docs/endpoints.md, "Load")."""

    running: int
    waiting: int | None  # None: the engine does not say (transformers serve)
    source: str  # "engine": its own metrics; "agent": the requests the agent forwards to it now
    at: datetime


class ReplicaOut(BaseModel):
    replica: int  # 1-based
    job_id: str
    state: str
    attempt: int
    cpod_id: str | None
    load: LoadOut | None = None


class UsageOut(BaseModel):
    day: str
    key_id: str | None
    requests: int
    prompt_tokens: int
    completion_tokens: int


class EndpointOut(BaseModel):
    id: str
    object: str = "endpoint"
    name: str
    model: str
    state: str
    reason: str | None
    url: str  # the OpenAI base_url to call it with; `model` is the endpoint's name
    gpu_product: str | None
    gpus: int
    replicas: int
    replicas_ready: int
    max_model_len: int | None
    engine_args: dict[str, str | int | float | bool]
    created_at: datetime
    ready_at: datetime | None
    stopped_at: datetime | None
    replica_jobs: list[ReplicaOut]
    usage: list[UsageOut]


def _load(loads: EngineLoads, job: Job) -> LoadOut | None:
    seen = endpoints.load_of(loads, job)
    if seen is None:
        return None
    said = seen.load
    return LoadOut(running=said.running, waiting=said.waiting, source=said.source, at=seen.at)


def _out(view: endpoints.View, base_url: str, usage: list[UsageOut], loads: EngineLoads) -> EndpointOut:
    e = view.endpoint
    return EndpointOut(
        id=e.id,
        name=e.name,
        model=e.model_name,
        state=view.state.value,
        reason=english(view.reason),
        url=f"{base_url.rstrip('/')}/v1",
        gpu_product=e.gpu_product,
        gpus=e.gpus,
        replicas=e.replicas,
        replicas_ready=len(view.ready),
        max_model_len=e.max_model_len,
        engine_args=e.engine_args,
        created_at=e.created_at,
        ready_at=e.ready_at,
        stopped_at=e.stopped_at,
        replica_jobs=[
            ReplicaOut(
                replica=r.index + 1,
                job_id=r.job.id,
                state=r.job.state.value,
                attempt=r.job.attempt,
                cpod_id=r.job.cpod_id,
                load=_load(loads, r.job),
            )
            for r in view.replicas
        ],
        usage=usage,
    )


def _usage(session: Session, endpoint_id: str) -> list[UsageOut]:
    return [
        UsageOut(
            day=u.day,
            key_id=u.key_id or None,
            requests=u.requests,
            prompt_tokens=u.prompt_tokens,
            completion_tokens=u.completion_tokens,
        )
        for u in routing.usage(session, endpoint_id)
    ]


@router.post("", status_code=201, response_model=EndpointOut, responses=WITH_BODY | errors(402, 404, 409))
def create(body: EndpointRequest, request: Request, user: CurrentUser, ctx: Ctx) -> EndpointOut:
    with ctx.db.session() as session:
        view = endpoints.create(ctx, session, owner=session.merge(user), request=body)
        return _out(view, str(request.base_url), [], ctx.engine_loads)


@router.get("", response_model=list[EndpointOut])
def list_endpoints(
    request: Request,
    user: CurrentUser,
    ctx: Ctx,
    stopped: Annotated[bool, Query(description="deleted endpoints too")] = False,
) -> list[EndpointOut]:
    with ctx.db.session() as session:
        return [
            _out(view, str(request.base_url), _usage(session, view.endpoint.id), ctx.engine_loads)
            for view in endpoints.list_for(session, user, stopped=stopped)
        ]


@router.get("/{endpoint_id}", response_model=EndpointOut, responses=NOT_FOUND)
def get(endpoint_id: str, request: Request, user: CurrentUser, ctx: Ctx) -> EndpointOut:
    with ctx.db.session() as session:
        view = endpoints.view(session, endpoints.get(session, user, endpoint_id))
        return _out(view, str(request.base_url), _usage(session, endpoint_id), ctx.engine_loads)


@router.delete("/{endpoint_id}", response_model=EndpointOut, responses=NOT_FOUND)
def delete(endpoint_id: str, request: Request, user: CurrentUser, ctx: Ctx) -> EndpointOut:
    with ctx.db.session() as session:
        view = endpoints.delete(session, session.merge(user), endpoint_id)
        return _out(view, str(request.base_url), _usage(session, endpoint_id), ctx.engine_loads)


@router.get("/{endpoint_id}/logs", responses=NOT_FOUND | errors(422), status_code=307)
def logs(
    endpoint_id: str,
    user: CurrentUser,
    ctx: Ctx,
    replica: Annotated[PosInt32, Query()] = 1,
    offset: Annotated[NonNegInt64, Query()] = 0,
) -> RedirectResponse:
    """The engine's log is its replica's job's: a redirect to that job's log from ``offset``."""
    with ctx.db.session() as session:
        job = endpoints.logs_job(session, user, endpoint_id, replica)
    return RedirectResponse(f"{paths.API}/jobs/{job.id}/logs?offset={offset}", status_code=307)
