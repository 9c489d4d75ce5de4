"""A failed replica replaced (docs/endpoints.md, "Replacing a failed replica"). A replica whose engine
served and then failed (after its restarts in place) is followed by a new job for the same replica
index, queued at once, so the endpoint is ``degraded`` while it is placed and loads, and ``ready``
again once it serves. Bounded: past ``PER_HOUR`` replacements of the endpoint within an hour, the
endpoint gives up: the failed replica keeps its reason, wrapped as ``endpoint.gave_up``, and the
others are stopped, so the endpoint is ``failed`` with that reason and bills nothing more. A replica
that never served is not replaced (an engine that cannot start would only fail again), and a lost
CPod's replica is requeued by the job system instead, as every job's attempt is."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from sxwl.cloud.db.endpoint_models import Endpoint, EndpointReplica
from sxwl.cloud.db.models import TERMINAL_STATES, Job, JobState
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.kit.notify import on_commit
from sxwl.cloud.services.jobs.attempts import finish, stop_command
from sxwl.cloud.services.jobs.job_events import add_event
from sxwl.protocol.reasons import Reason, english

PER_HOUR = 3  # replacements of one endpoint's replicas within any hour


def replace(session: Session, failed: Job, reason: Reason | None) -> Reason | None:
    """Called as ``failed`` is about to end failed with ``reason``: queues its replacement, or gives
    the endpoint up. Returns the reason the failed job ends with."""
    found = session.execute(
        select(Endpoint, EndpointReplica.replica)
        .join(EndpointReplica, EndpointReplica.endpoint_id == Endpoint.id)
        .where(EndpointReplica.job_id == failed.id)
    ).first()
    if found is None or failed.started_at is None:
        return reason
    endpoint, index = found
    if endpoint.stopped_at is not None:
        return reason
    jobs = list(
        session.scalars(
            select(Job)
            .join(EndpointReplica, EndpointReplica.job_id == Job.id)
            .where(EndpointReplica.endpoint_id == endpoint.id)
        )
    )
    if _replaced_within_hour(session, endpoint.id, jobs) >= PER_HOUR:
        gave_up = Reason.of("endpoint.gave_up", replica=index + 1, times=PER_HOUR, why=reason)
        for other in jobs:
            if other.id != failed.id and other.state not in TERMINAL_STATES:
                _stop(session, other, gave_up)
        return gave_up
    replacement = Job(
        owner_id=failed.owner_id,
        name=failed.name,
        command=failed.command,
        image=failed.image,
        env=dict(failed.env),
        gpu_product=failed.gpu_product,
        gpus_per_node=failed.gpus_per_node,
        nodes=failed.nodes,
        max_runtime_s=failed.max_runtime_s,
        pinned_cpod_id=failed.pinned_cpod_id,
        priority=failed.priority,
        max_attempts=failed.max_attempts,
        state=JobState.QUEUED,
        attempt=0,
        node_names=[],
        reason=Reason.of("queue.scheduler"),
        inputs=list(failed.inputs),
        engine=dict(failed.engine or {}),
    )
    session.add(replacement)
    session.flush()
    session.add(EndpointReplica(job_id=replacement.id, endpoint_id=endpoint.id, replica=index))
    add_event(session, replacement, "submitted", Reason.of("endpoint.replacing", job=failed.id, why=reason))
    on_commit(session).wake_scheduler()
    return reason


def _replaced_within_hour(session: Session, endpoint_id: str, jobs: list[Job]) -> int:
    """Jobs of the endpoint created in the last hour that replaced an earlier job of their index:
    each index's first job was deployed, not a replacement (counted without ordering the jobs, whose
    times may be equal)."""
    indexes = dict(
        session.execute(
            select(EndpointReplica.job_id, EndpointReplica.replica).where(
                EndpointReplica.endpoint_id == endpoint_id
            )
        ).all()
    )
    since = utcnow() - timedelta(hours=1)
    total: Counter[int] = Counter(indexes[job.id] for job in jobs)
    recent: Counter[int] = Counter(indexes[job.id] for job in jobs if job.created_at >= since)
    return sum(n - 1 if n == total[index] else n for index, n in recent.items())


def _stop(session: Session, job: Job, why: Reason) -> None:
    """Stops another replica of an endpoint that gave up, as a cancel does, with ``why``."""
    if job.state == JobState.QUEUED:
        finish(job, JobState.CANCELLED, reason=why)
        add_event(session, job, "cancelled", why)
    elif job.cancel_requested_at is None and job.cpod_id is not None:
        job.cancel_requested_at = utcnow()
        job.cancel_reason = why
        stop_command(session, job, job.cpod_id, job.attempt, english(why) or "", cancel=True)
        add_event(session, job, "cancel_requested", why)
