"""Which replica answers a /v1 call (docs/endpoints.md, "Calling an endpoint"), and what its answer
counted. ``model`` names one of the caller's endpoints, or the model one of them serves; only the
owner's credentials reach an endpoint."""

from __future__ import annotations

import random

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from sxwl.cloud.db.endpoint_models import Endpoint, EndpointUsage
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.errors import AppError
from sxwl.cloud.services.endpoints import endpoints
from sxwl.cloud.services.endpoints.endpoints import State
from sxwl.cloud.services.endpoints.routes import Replica, Route, Serving
from sxwl.cloud.services.fleet.engine_loads import EngineLoads
from sxwl.protocol import attempt_key
from sxwl.protocol.endpoints import engine_target

RETRY_AFTER_S = 10  # what a call to an endpoint that does not serve yet is told to wait


def _not_ready(view: endpoints.View) -> AppError:
    name = view.endpoint.name
    message = f"endpoint {name} is {view.state.value}; retry in a few seconds"
    return AppError(
        503,
        message,
        code="endpoint_not_ready",
        details={"endpoint": view.endpoint.id, "state": view.state.value},
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def find(session: Session, owner_id: str, model: str) -> endpoints.View:
    """The caller's live endpoint called ``model``, else the ready one serving model ``model``."""
    live = select(Endpoint).where(Endpoint.owner_id == owner_id, Endpoint.stopped_at.is_(None))
    named = session.scalar(live.where(Endpoint.name == model))
    if named is not None:
        return endpoints.view(session, named)
    serving = [endpoints.view(session, e) for e in session.scalars(live.where(Endpoint.model_name == model))]
    for view in serving:
        if view.ready:
            return view
    if serving:
        return serving[0]
    message = f"no endpoint named {model}, nor one serving it; GET /v1/models lists your ready endpoints"
    raise AppError(
        404, f"model: {message}", code="model_not_found", details=[{"field": "model", "message": message}]
    )


def serving(session: Session, owner_id: str, model: str) -> Serving:
    """The replicas of the caller's endpoint ``model`` names that serve now; 503 with Retry-After
    when none does."""
    view = find(session, owner_id, model)
    replicas = tuple(
        Replica(job.cpod_id, engine_target(job.id, job.attempt), attempt_key(job.id, job.attempt))
        for job in view.ready
        if job.cpod_id is not None
    )
    if view.state in (State.STOPPED, State.FAILED) or not replicas:
        raise _not_ready(view)
    return Serving(view.endpoint.id, view.endpoint.name, replicas)


def pick(found: Serving, loads: EngineLoads | None = None) -> Route:
    """Of two replicas picked at random, the one whose engine the heartbeats said was less busy
    (``loads``: requests running and waiting): a load is as old as its heartbeat, and sending every
    call to the one least busy then would pile them onto it until the next; two random choices
    spread them and still shun a busy engine."""
    picked = random.sample(found.replicas, min(2, len(found.replicas)))  # spreading load, not a secret

    def busy(replica: Replica) -> int:
        seen = loads.of(replica.cpod_id, replica.attempt_key) if loads is not None else None
        return 0 if seen is None else seen.load.running + (seen.load.waiting or 0)

    replica = min(picked, key=busy)
    return Route(found.endpoint_id, found.name, replica.cpod_id, replica.target)


def ready_names(session: Session, owner_id: str) -> list[tuple[str, str, int]]:
    """The caller's ready endpoints for /v1/models: (name, model served, created unix time)."""
    found = session.scalars(
        select(Endpoint)
        .where(Endpoint.owner_id == owner_id, Endpoint.stopped_at.is_(None))
        .order_by(Endpoint.created_at)
    )
    out = []
    for endpoint in found:
        view = endpoints.view(session, endpoint)
        if view.state in (State.READY, State.DEGRADED) and view.ready:
            out.append((endpoint.name, endpoint.model_name, int(endpoint.created_at.timestamp())))
    return out


def record_usage(session: Session, endpoint_id: str, key_id: str, prompt: int, completion: int) -> None:
    """One answered request and its tokens on today's row (UTC), added in the database (replicas
    count into the same row); the day's first requests racing to create it add to the winner's."""
    day = utcnow().strftime("%Y-%m-%d")
    added = (
        update(EndpointUsage)
        .where(
            EndpointUsage.endpoint_id == endpoint_id,
            EndpointUsage.key_id == key_id,
            EndpointUsage.day == day,
        )
        .values(
            requests=EndpointUsage.requests + 1,
            prompt_tokens=EndpointUsage.prompt_tokens + prompt,
            completion_tokens=EndpointUsage.completion_tokens + completion,
        )
    )
    if session.execute(added).rowcount:  # type: ignore[attr-defined]
        return
    first = EndpointUsage(
        endpoint_id=endpoint_id,
        key_id=key_id,
        day=day,
        requests=1,
        prompt_tokens=prompt,
        completion_tokens=completion,
    )
    try:
        with session.begin_nested():
            session.add(first)
    except IntegrityError:
        session.execute(added)


def usage(session: Session, endpoint_id: str) -> list[EndpointUsage]:
    return list(
        session.scalars(
            select(EndpointUsage).where(EndpointUsage.endpoint_id == endpoint_id).order_by(EndpointUsage.day)
        )
    )
