"""What compute users do with jobs: submit, list, look at one, cancel. What happens to a placed
attempt is in attempts.py, logs in job_logs.py, the history in job_events.py."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import TERMINAL_STATES, Artifact, CPod, Job, JobState, Role, User
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.errors import AppError, invalid
from sxwl.cloud.notify import on_commit
from sxwl.cloud.services.attempts import finish, stop_command
from sxwl.cloud.services.job_events import add_event


@dataclass(frozen=True)
class JobSpec:
    name: str
    command: list[str] | str
    image: str | None
    env: dict[str, str]
    gpu_product: str | None
    gpus_per_node: int
    nodes: int
    max_runtime_s: int | None
    cpod_id: str | None
    priority: int


def submit(ctx: CloudContext, session: Session, owner: User, spec: JobSpec) -> Job:
    if owner.role == Role.PROVIDER:
        raise AppError(403, "jobs are submitted by compute users (算力用户); sign up as one to run jobs")
    if spec.priority > 0 and owner.role != Role.ADMIN:
        raise invalid("priority", "only administrators may raise a job's priority above 0")
    if spec.cpod_id is not None:
        cpod = session.get(CPod, spec.cpod_id)
        if cpod is None or cpod.revoked_at is not None:
            raise invalid("cpod_id", f"no CPod {spec.cpod_id}")
    job = Job(
        owner_id=owner.id,
        name=spec.name,
        command=spec.command,
        image=spec.image,
        env=spec.env,
        gpu_product=spec.gpu_product,
        gpus_per_node=spec.gpus_per_node,
        nodes=spec.nodes,
        max_runtime_s=spec.max_runtime_s,
        pinned_cpod_id=spec.cpod_id,
        priority=spec.priority,
        max_attempts=ctx.settings.job_max_attempts,
        state=JobState.QUEUED,
        attempt=0,
        node_names=[],
        reason="waiting for the scheduler",
    )
    session.add(job)
    session.flush()
    add_event(session, job, "submitted", f"{spec.nodes} node(s) × {spec.gpus_per_node} GPU(s)")
    on_commit(session).wake_scheduler()
    return job


def get_for(session: Session, user: User, job_id: str, for_update: bool = False) -> Job:
    stmt = select(Job).where(Job.id == job_id)
    job = session.scalar(stmt.with_for_update() if for_update else stmt)
    if job is None:
        raise AppError(404, f"no job {job_id}")
    if user.role != Role.ADMIN and job.owner_id != user.id:
        raise AppError(403, "this job belongs to another user")
    return job


@dataclass(frozen=True)
class JobPage:
    items: list[Job]
    total: int
    page: int
    per_page: int


def list_for(
    session: Session,
    user: User,
    page: int,
    per_page: int,
    states: list[JobState] | None = None,
    query: str = "",
    everyone: bool = False,
) -> JobPage:
    stmt = select(Job)
    if not (everyone and user.role == Role.ADMIN):
        stmt = stmt.where(Job.owner_id == user.id)
    if states:
        stmt = stmt.where(Job.state.in_(states))
    if query:
        stmt = stmt.where(
            or_(Job.name.contains(query, autoescape=True), Job.id.startswith(query, autoescape=True))
        )
    total = session.scalar(select(func.count()).select_from(stmt.subquery())) or 0
    items = session.scalars(
        stmt.order_by(Job.created_at.desc(), Job.id).offset((page - 1) * per_page).limit(per_page)
    )
    return JobPage(list(items), total, page, per_page)


def queue_position(session: Session, job: Job) -> int | None:
    """1-based place among queued jobs by priority, then age (fair share may reorder users within
    one priority; this is the position before that)."""
    if job.state != JobState.QUEUED:
        return None
    ahead = session.scalar(
        select(func.count())
        .select_from(Job)
        .where(
            Job.state == JobState.QUEUED,
            or_(
                Job.priority > job.priority,
                and_(Job.priority == job.priority, Job.created_at < job.created_at),
            ),
        )
    )
    return (ahead or 0) + 1


def cancel(session: Session, user: User, job_id: str) -> Job:
    job = get_for(session, user, job_id, for_update=True)
    if job.state in TERMINAL_STATES:
        raise AppError(409, f"job is already {job.state.value}", code="job_finished")
    if job.state == JobState.QUEUED:
        finish(job, JobState.CANCELLED, reason=f"cancelled by {user.email}")
        add_event(session, job, "cancelled", f"by {user.email}")
        on_commit(session).wake_scheduler()  # its place in the queue is free
    elif job.cancel_requested_at is None:
        job.cancel_requested_at = utcnow()
        assert job.cpod_id is not None
        stop_command(session, job, job.cpod_id, job.attempt, f"cancelled by {user.email}", cancel=True)
        add_event(session, job, "cancel_requested", f"by {user.email}")
    return job


def artifacts(session: Session, job: Job) -> list[Artifact]:
    return list(session.scalars(select(Artifact).where(Artifact.job_id == job.id).order_by(Artifact.path)))
