"""What compute users do with jobs: submit, list, look at one, cancel. What happens to a placed
attempt is in attempts.py, logs in job_logs.py, the history in job_events.py."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session, joinedload

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import TERMINAL_STATES, Artifact, CPod, Job, JobState, Role, User
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.errors import AppError, invalid
from sxwl.cloud.kit.notify import on_commit
from sxwl.cloud.services.jobs.attempts import finish, stop_command
from sxwl.cloud.services.jobs.job_events import add_event
from sxwl.cloud.services.jobs.job_kinds import Workload, kind_of
from sxwl.cloud.services.money import billing
from sxwl.protocol.jobs import JobIn
from sxwl.protocol.reasons import Reason


def submit(
    ctx: CloudContext, session: Session, owner: User, spec: JobIn, workload: Workload | None = None
) -> Job:
    """A new queued job; ``workload``: what a workload kind's job holds besides ``spec``."""
    if owner.role == Role.PROVIDER:
        raise AppError(403, "jobs are submitted by compute users (算力用户); sign up as one to run jobs")
    if spec.priority > 0 and owner.role != Role.ADMIN:
        raise invalid("priority", "only administrators may raise a job's priority above 0")
    if spec.cpod_id is not None:
        cpod = session.get(CPod, spec.cpod_id)
        if cpod is None or cpod.revoked_at is not None:
            raise invalid("cpod_id", f"no CPod {spec.cpod_id}")
    billing.require_funds(ctx, session, owner, spec, workload.cpus if workload else None)
    job = Job(
        owner_id=owner.id,
        **spec.model_dump(exclude={"cpod_id"}),
        pinned_cpod_id=spec.cpod_id,
        max_attempts=ctx.settings.job_max_attempts,
        state=JobState.QUEUED,
        attempt=0,
        node_names=[],
        reason=Reason.of("queue.scheduler"),
        trainer=workload.trainer if workload else None,
        engine=workload.engine if workload else None,
        inputs=list(workload.inputs) if workload else [],
        dev_env_id=workload.dev_env_id if workload else None,
        cpus=workload.cpus if workload else None,
        memory_mib=workload.memory_mib if workload else None,
    )
    # A kind that would not know its own job (or is not registered) would never hear of it again.
    if kind_of(job) is not (workload.kind if workload else None):
        raise RuntimeError(f"job {job.name}: its workload kind is not the registered kind that owns it")
    session.add(job)
    session.flush()
    add_event(session, job, "submitted", Reason.of("job.shape", nodes=spec.nodes, gpus=spec.gpus_per_node))
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
    # Owners come in the same query: a page shows each job's owner.
    items = session.scalars(
        stmt.options(joinedload(Job.owner))
        .order_by(Job.created_at.desc(), Job.id)
        .offset((page - 1) * per_page)
        .limit(per_page)
    )
    return JobPage(list(items), total, page, per_page)


def queue_positions(session: Session, jobs: Sequence[Job]) -> dict[str, int]:
    """The 1-based place of each queued job among ``jobs`` in the queue, by priority, then age
    (fair share may reorder users within one priority; this is the position before that). One query
    for a whole page: jobs that were submitted at the same instant share a place."""
    queued = [job.id for job in jobs if job.state == JobState.QUEUED]
    if not queued:
        return {}
    place = func.rank().over(order_by=(Job.priority.desc(), Job.created_at)).label("place")
    ranked = select(Job.id, place).where(Job.state == JobState.QUEUED).subquery()
    rows = session.execute(select(ranked.c.id, ranked.c.place).where(ranked.c.id.in_(queued)))
    return {job_id: int(n) for job_id, n in rows}


def finished(state: str, what: str = "job") -> AppError:
    """The answer to cancelling what has already ended: a sentence, and its state for the console's."""
    message = f"This {what} has already finished ({state}); there is nothing to cancel."
    return AppError(409, message, code="job_finished", details={"state": state})


def cancel(session: Session, user: User, job_id: str) -> Job:
    job = get_for(session, user, job_id, for_update=True)
    if job.state in TERMINAL_STATES:
        raise finished(job.state.value)
    if job.state == JobState.QUEUED:
        finish(job, JobState.CANCELLED, reason=Reason.of("job.cancelled_by", who=user.email))
        add_event(session, job, "cancelled", Reason.of("job.by", who=user.email))
        on_commit(session).wake_scheduler()  # its place in the queue is free
    elif job.cancel_requested_at is None:
        job.cancel_requested_at = utcnow()
        job.cancel_reason = Reason.of("job.cancelled_by", who=user.email)
        assert job.cpod_id is not None
        stop_command(session, job, job.cpod_id, job.attempt, f"cancelled by {user.email}", cancel=True)
        add_event(session, job, "cancel_requested", Reason.of("job.by", who=user.email))
    return job


def artifacts(session: Session, job: Job) -> list[Artifact]:
    return list(session.scalars(select(Artifact).where(Artifact.job_id == job.id).order_by(Artifact.path)))
