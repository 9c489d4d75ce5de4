"""Endpoints as their users see them (docs/endpoints.md): deploy one (its model, GPUs and balance
checked before anything is written), list, look, delete. Each replica is an ordinary job of the
endpoint kind, submitted through jobs.submit, so it is scheduled, fenced, requeued, stopped by an
empty balance and billed as every job is; the endpoint's state is read from its replicas' jobs."""

from __future__ import annotations

import enum
import secrets
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.endpoint_models import Endpoint, EndpointReplica
from sxwl.cloud.db.finetune_models import CatalogModel, ModelKind
from sxwl.cloud.db.json_rows import StoredInput, stored_input
from sxwl.cloud.db.models import TERMINAL_STATES, Job, JobState, Role, User
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.errors import AppError, invalid
from sxwl.cloud.kit.notify import on_commit
from sxwl.cloud.services.catalog import model_catalog
from sxwl.cloud.services.endpoints.endpoint_kind import ENDPOINT
from sxwl.cloud.services.fleet import cpods
from sxwl.cloud.services.fleet.engine_loads import EngineLoads, SeenLoad
from sxwl.cloud.services.jobs import jobs
from sxwl.cloud.services.jobs.job_kinds import Workload
from sxwl.cloud.services.money import billing
from sxwl.protocol import attempt_key
from sxwl.protocol.endpoints import EndpointRequest, EngineSpec
from sxwl.protocol.finetune import JobInput
from sxwl.protocol.jobs import JobIn
from sxwl.protocol.reasons import Reason

# What a replica's job runs where the runtime does not know engines: a clear "command not found".
ENGINE_COMMAND = ["sxwl-engine"]


class State(enum.StrEnum):
    PENDING = "pending"  # no replica placed yet
    DEPLOYING = "deploying"  # placed, its engines loading
    READY = "ready"
    DEGRADED = "degraded"  # was ready; a replica is lost or being replaced
    STOPPED = "stopped"
    FAILED = "failed"


@dataclass(frozen=True)
class Replica:
    index: int
    job: Job


@dataclass(frozen=True)
class View:
    endpoint: Endpoint
    replicas: list[Replica]
    state: State
    reason: Reason | None

    @property
    def ready(self) -> list[Job]:
        return [r.job for r in self.replicas if r.job.state == JobState.RUNNING]


def _when(job: Job) -> datetime:
    """When a job last changed as its endpoint counts it: its end, else its submission."""
    return job.finished_at or job.created_at


def _state(endpoint: Endpoint, replicas: list[Replica]) -> tuple[State, Reason | None]:
    live = [r.job for r in replicas if r.job.state not in TERMINAL_STATES]
    if endpoint.stopped_at is not None:
        return State.STOPPED, None
    if not live:
        failed = [r.job for r in replicas if r.job.state == JobState.FAILED]
        if failed:  # the last to fail says why (an endpoint that gave up: endpoint.gave_up)
            return State.FAILED, max(failed, key=_when).reason
        return State.STOPPED, replicas[-1].job.reason if replicas else None  # a balance stop, say
    ready = sum(1 for job in live if job.state == JobState.RUNNING)
    if ready == endpoint.replicas:
        return State.READY, None
    if endpoint.ready_at is not None:
        short = [r.job for r in replicas if r.job.state != JobState.RUNNING]
        return State.DEGRADED, max(short, key=_when).reason if short else None
    if all(job.state in (JobState.QUEUED, JobState.LOST) for job in live):
        return State.PENDING, live[0].reason  # the scheduler's words: what it waits for
    return State.DEPLOYING, None


def view(session: Session, endpoint: Endpoint) -> View:
    rows = session.execute(
        select(EndpointReplica.replica, Job)
        .join(Job, Job.id == EndpointReplica.job_id)
        .where(EndpointReplica.endpoint_id == endpoint.id)
    )
    # A replaced replica's jobs in the order they ran: its live one last (times may be equal).
    replicas = sorted(
        (Replica(index, job) for index, job in rows),
        key=lambda r: (r.index, r.job.created_at, r.job.state not in TERMINAL_STATES),
    )
    state, reason = _state(endpoint, replicas)
    return View(endpoint, replicas, state, reason)


def load_of(loads: EngineLoads, job: Job) -> SeenLoad | None:
    """A serving replica's engine load, as its CPod's last heartbeat to this process said."""
    if job.state != JobState.RUNNING:
        return None
    return loads.of(job.cpod_id, attempt_key(job.id, job.attempt))


def replicas_named(session: Session, job_ids: list[str]) -> dict[str, tuple[str, int]]:
    """For the jobs among ``job_ids`` that are endpoint replicas: their endpoint's name and their
    replica number (1-based), as the provider's 算力详情 names the work on its CPods."""
    if not job_ids:
        return {}
    rows = session.execute(
        select(EndpointReplica.job_id, Endpoint.name, EndpointReplica.replica)
        .join(Endpoint, Endpoint.id == EndpointReplica.endpoint_id)
        .where(EndpointReplica.job_id.in_(job_ids))
    )
    return {job_id: (name, index + 1) for job_id, name, index in rows}


def _models(session: Session, owner: User, name: str) -> tuple[CatalogModel, CatalogModel | None]:
    """The base model served, and the adapter on it for a fine-tuned model."""
    model = model_catalog.find(session, owner, name)
    if model is None:
        message = f"no model {name} of yours or the catalogue's; GET /v1/models lists them"
        raise AppError(404, f"model: {message}", details=[{"field": "model", "message": message}])
    if model.kind == ModelKind.BASE:
        return model, None
    if model.base is None:
        raise invalid("model", f"{name} is an adapter without its base model in the catalogue")
    return model.base, model


def _input(name: str, model: CatalogModel) -> StoredInput:
    entry = JobInput.model_validate(
        {"name": name, "sha256": model.sha256, "size": model.bytes, "archive": True}
    )
    return stored_input(entry, model.object)


def create(ctx: CloudContext, session: Session, *, owner: User, request: EndpointRequest) -> View:
    """Everything is checked before anything is written: a refused request leaves no row behind."""
    if owner.role == Role.PROVIDER:
        raise AppError(403, "endpoints are deployed by compute users (算力用户); sign up as one")
    taken = session.scalar(
        select(Endpoint.id).where(
            Endpoint.owner_id == owner.id, Endpoint.name == request.name, Endpoint.stopped_at.is_(None)
        )
    )
    if taken is not None:
        message = (
            f"you already have an endpoint named {request.name} ({taken}); delete it or pick another name"
        )
        raise AppError(
            409, f"name: {message}", code="conflict", details=[{"field": "name", "message": message}]
        )
    base, adapter = _models(session, owner, request.model)
    if request.gpu_product is not None:
        offered = {line.product for line in cpods.gpu_types(session)}
        if request.gpu_product not in offered:
            known = ", ".join(sorted(offered)) or "none online"
            raise invalid("gpu_product", f"no online CPod offers {request.gpu_product} (offered: {known})")
    shape = JobIn(
        name=f"endpoint {request.name}",
        command=ENGINE_COMMAND,
        gpu_product=request.gpu_product,
        gpus_per_node=request.gpus,
    )
    # The first hour of every replica at once: each submission below checks only its own.
    billing.require_funds(ctx, session, owner, shape.model_copy(update={"nodes": request.replicas}))
    endpoint = Endpoint(
        id=f"ep-{secrets.token_hex(10)}",
        owner_id=owner.id,
        name=request.name,
        model_name=request.model,
        base_model_id=base.id,
        adapter_id=adapter.id if adapter else None,
        gpu_product=request.gpu_product,
        gpus=request.gpus,
        replicas=request.replicas,
        max_model_len=request.max_model_len,
        engine_args=dict(request.engine_args),
    )
    session.add(endpoint)
    session.flush()
    spec = EngineSpec(
        served_name=request.name,
        adapter=adapter is not None,
        max_model_len=request.max_model_len,
        engine_args=dict(request.engine_args),
    )
    inputs = [_input("model", base), *([_input("adapter", adapter)] if adapter else [])]
    for index in range(request.replicas):
        workload = Workload(ENDPOINT, engine=spec.model_dump(mode="json"), inputs=inputs)
        named = shape.model_copy(update={"name": f"endpoint {request.name} #{index + 1}"})
        job = jobs.submit(ctx, session, owner, named, workload)
        session.add(EndpointReplica(job_id=job.id, endpoint_id=endpoint.id, replica=index))
    session.flush()
    on_commit(session).user_changed(owner.id)  # its name may now mean this endpoint in /v1
    return view(session, endpoint)


def get(session: Session, user: User, endpoint_id: str) -> Endpoint:
    """Another user's endpoint is as absent as one that does not exist; administrators see all."""
    endpoint = session.get(Endpoint, endpoint_id)
    if endpoint is None or (endpoint.owner_id != user.id and user.role != Role.ADMIN):
        raise AppError(404, f"no endpoint {endpoint_id}")
    return endpoint


def list_for(session: Session, user: User, *, stopped: bool = False) -> list[View]:
    """Newest first; ``stopped``: deleted ones too."""
    stmt = select(Endpoint).where(Endpoint.owner_id == user.id)
    if not stopped:
        stmt = stmt.where(Endpoint.stopped_at.is_(None))
    found = session.scalars(stmt.order_by(Endpoint.created_at.desc(), Endpoint.id.desc()).limit(500))
    return [view(session, endpoint) for endpoint in found]


def delete(session: Session, user: User, endpoint_id: str) -> View:
    """Stops every replica (an acknowledged stop, as a cancelled job's) and frees the name."""
    endpoint = get(session, user, endpoint_id)
    if endpoint.stopped_at is None:
        for replica in view(session, endpoint).replicas:
            if replica.job.state not in TERMINAL_STATES:
                jobs.cancel(session, user, replica.job.id)
        endpoint.stopped_at = utcnow()
        session.flush()
        on_commit(session).user_changed(endpoint.owner_id)  # /v1 stops routing to it at once
    return view(session, endpoint)


def logs_job(session: Session, user: User, endpoint_id: str, replica: int) -> Job:
    """The job of replica ``replica`` (1-based), whose log is the engine's."""
    found = view(session, get(session, user, endpoint_id)).replicas
    chosen = [r.job for r in found if r.index == replica - 1]
    if not chosen:
        raise invalid("replica", f"the endpoint has replicas 1 to {len(found)}")
    return chosen[-1]
