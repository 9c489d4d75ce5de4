"""Jobs: submission, the state machine, cancel, logs and artifacts, and requeueing lost work."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import (
    ACTIVE_STATES,
    TERMINAL_STATES,
    AgentCommand,
    Artifact,
    CPod,
    Job,
    JobAttempt,
    JobEvent,
    JobState,
    LogChunk,
    Role,
    User,
)
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.errors import AppError, invalid
from sxwl.cloud.notify import on_commit

# What an agent may report after each state; terminal states never change (invariant 4, docs/architecture.md).
AGENT_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.ASSIGNED: frozenset({JobState.STARTING, JobState.RUNNING, JobState.LOST} | TERMINAL_STATES),
    JobState.STARTING: frozenset({JobState.RUNNING, JobState.LOST} | TERMINAL_STATES),
    JobState.RUNNING: frozenset({JobState.LOST} | TERMINAL_STATES),
}


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


def event(session: Session, job: Job, kind: str, detail: str | None = None) -> None:
    event_for(session, job.id, job.attempt, kind, detail)


def event_for(session: Session, job_id: str, attempt: int, kind: str, detail: str | None = None) -> None:
    session.add(JobEvent(job_id=job_id, attempt=attempt, kind=kind, detail=detail))


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
    event(session, job, "submitted", f"{spec.nodes} node(s) × {spec.gpus_per_node} GPU(s)")
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


def stop_command(
    session: Session, job: Job, cpod_id: str, attempt: int, reason: str, cancel: bool = False
) -> None:
    """Tells a CPod to stop one attempt, once: repeated calls do not pile up commands."""
    kind = "cancel" if cancel else "stop"
    exists = session.scalar(
        select(AgentCommand.id).where(
            AgentCommand.cpod_id == cpod_id,
            AgentCommand.job_id == job.id,
            AgentCommand.attempt == attempt,
            AgentCommand.kind == kind,
            AgentCommand.acked_at.is_(None),
        )
    )
    if exists is None:
        session.add(AgentCommand(cpod_id=cpod_id, kind=kind, job_id=job.id, attempt=attempt, reason=reason))
        on_commit(session).wake_cpod(cpod_id)


def cancel(session: Session, user: User, job_id: str) -> Job:
    job = get_for(session, user, job_id, for_update=True)
    if job.state in TERMINAL_STATES:
        raise AppError(409, f"job is already {job.state.value}", code="job_finished")
    if job.state == JobState.QUEUED:
        finish(job, JobState.CANCELLED, reason=f"cancelled by {user.email}")
        event(session, job, "cancelled", f"by {user.email}")
        on_commit(session).wake_scheduler()  # its place in the queue is free
    elif job.cancel_requested_at is None:
        job.cancel_requested_at = utcnow()
        assert job.cpod_id is not None
        stop_command(session, job, job.cpod_id, job.attempt, f"cancelled by {user.email}", cancel=True)
        event(session, job, "cancel_requested", f"by {user.email}")
    return job


def finish(job: Job, state: JobState, exit_code: int | None = None, reason: str | None = None) -> None:
    job.state = state
    job.finished_at = utcnow()
    job.exit_code = exit_code
    job.reason = reason


def close_attempt(session: Session, job: Job, outcome: str) -> None:
    placed = session.get(JobAttempt, (job.id, job.attempt))
    if placed is not None and placed.finished_at is None:
        placed.finished_at = utcnow()
        placed.outcome = outcome


def requeue(session: Session, job: Job, why: str) -> None:
    """The attempt is lost: queue a new attempt (or give up after max_attempts) and fence the old one."""
    old_cpod, old_attempt = job.cpod_id, job.attempt
    close_attempt(session, job, JobState.LOST.value)
    job.state = JobState.LOST
    event(session, job, "lost", why)
    if old_cpod is not None:
        stop_command(session, job, old_cpod, old_attempt, f"attempt {old_attempt} was lost: {why}")
    if job.cancel_requested_at is not None:
        finish(job, JobState.CANCELLED, reason="cancelled while its CPod was lost")
        event(session, job, "cancelled", job.reason)
    elif job.attempt >= job.max_attempts:
        finish(job, JobState.FAILED, reason=f"lost {job.attempt} times; last: {why}")
        event(session, job, "failed", job.reason)
    else:
        job.state = JobState.QUEUED
        job.cpod_id = None
        job.node_names = []
        job.reason = f"queued again: {why}"
        event(session, job, "requeued", why)
        on_commit(session).wake_scheduler()


def requeue_cpod_jobs(session: Session, cpod_id: str, why: str) -> int:
    jobs = session.scalars(
        select(Job).where(Job.cpod_id == cpod_id, Job.state.in_(ACTIVE_STATES)).with_for_update()
    ).all()
    for job in jobs:
        requeue(session, job, why)
    return len(jobs)


# ---- reports from agents ---------------------------------------------------------------------


class StaleAttempt(AppError):
    def __init__(self, job: Job, attempt: int) -> None:
        super().__init__(
            409,
            f"attempt {attempt} of job {job.id} is no longer current "
            f"(current: {job.attempt}, {job.state.value}); stop it",
            code="stale_attempt",
            details={"stop": True, "current_attempt": job.attempt},
        )


def job_for_agent(session: Session, cpod: CPod, job_id: str, attempt: int) -> Job:
    """The job, locked, if this CPod runs this attempt of it; otherwise 403/404/409 (with a stop command)."""
    job = session.scalar(select(Job).where(Job.id == job_id).with_for_update())
    if job is None:
        raise AppError(404, f"no job {job_id}")
    if job.attempt != attempt or job.cpod_id != cpod.id:
        placed = session.get(JobAttempt, (job_id, attempt))
        if placed is None or placed.cpod_id != cpod.id:
            raise AppError(403, "this job attempt was not assigned to this CPod", code="not_your_job")
        stop_command(session, job, cpod.id, attempt, "stale attempt")
        raise StaleAttempt(job, attempt)
    return job


def report_status(
    ctx: CloudContext,
    session: Session,
    cpod: CPod,
    job_id: str,
    attempt: int,
    state: JobState,
    exit_code: int | None,
    reason: str | None,
) -> Job:
    job = job_for_agent(session, cpod, job_id, attempt)
    if job.state == state:
        return job  # a retried report
    if job.state in TERMINAL_STATES or state not in AGENT_TRANSITIONS.get(job.state, frozenset()):
        raise AppError(
            409,
            f"job is {job.state.value}; it cannot become {state.value}",
            code="bad_transition",
            details={"state": job.state.value},
        )
    if state == JobState.LOST:
        requeue(session, job, reason or "the agent could not resume it")
        return job
    if state in TERMINAL_STATES:
        if state == JobState.FAILED and job.cancel_requested_at is not None:
            state, reason = JobState.CANCELLED, reason or "cancelled"
        if reason is None and state == JobState.FAILED and exit_code is not None:
            reason = f"exit code {exit_code}"
        close_attempt(session, job, state.value)
        finish(job, state, exit_code, reason)
        on_commit(session).wake_scheduler()
    else:
        job.state = state
        job.reason = None
        if state == JobState.RUNNING:
            job.started_at = utcnow()
            placed = session.get(JobAttempt, (job.id, job.attempt))
            if placed is not None:
                placed.started_at = job.started_at
    event(session, job, state.value, reason)
    return job


def log_size(session: Session, job_id: str, attempt: int) -> int:
    last = session.execute(
        select(LogChunk.offset, func.length(LogChunk.data))
        .where(LogChunk.job_id == job_id, LogChunk.attempt == attempt)
        .order_by(LogChunk.offset.desc())
        .limit(1)
    ).first()
    return int(last[0] + last[1]) if last else 0


def append_log(session: Session, job: Job, attempt: int, offset: int, data: bytes) -> int:
    """Idempotent append: bytes already held are skipped, a gap is refused with the expected offset."""
    size = log_size(session, job.id, attempt)
    if offset > size:
        raise AppError(
            409,
            f"log offset {offset} is past the end ({size}); resend from {size}",
            code="log_gap",
            details={"next_offset": size},
        )
    fresh = data[size - offset :]
    if fresh:
        try:
            with session.begin_nested():
                session.add(LogChunk(job_id=job.id, attempt=attempt, offset=size, data=fresh))
        except IntegrityError:
            pass  # the same bytes arrived twice at once; the first one is kept
    return size + len(fresh)


@dataclass(frozen=True)
class LogSlice:
    data: bytes
    next_offset: int
    complete: bool


def read_log(ctx: CloudContext, session: Session, job: Job, attempt: int, offset: int) -> LogSlice:
    limit = ctx.settings.log_read_max_bytes
    rows = session.execute(
        select(LogChunk.offset, LogChunk.data)
        .where(
            LogChunk.job_id == job.id,
            LogChunk.attempt == attempt,
            LogChunk.offset + func.length(LogChunk.data) > offset,
        )
        .order_by(LogChunk.offset)
    ).all()
    out = bytearray()
    position = offset
    for start, data in rows:
        if start > position or len(out) >= limit:
            break
        piece = data[position - start :][: limit - len(out)]
        out += piece
        position += len(piece)
    end = log_size(session, job.id, attempt)
    # An earlier attempt never grows again; the current one is done when the job is. A queued job's
    # log is not complete: its (next) attempt has yet to run.
    finished = attempt < job.attempt or job.state in TERMINAL_STATES
    # An offset past the end is answered with the end, where a reader can really continue.
    next_offset = min(position, end)
    return LogSlice(bytes(out), next_offset, finished and next_offset >= end)


def record_artifact(session: Session, job: Job, attempt: int, path: str, size: int, sha256: str) -> None:
    """One row per (job, path): a later upload of the path replaces the record, also when two uploads
    of it are recorded at the same moment (the unique index refuses the second insert)."""
    existing = session.scalar(select(Artifact).where(Artifact.job_id == job.id, Artifact.path == path))
    if existing is None:
        try:
            with session.begin_nested():
                session.add(Artifact(job_id=job.id, attempt=attempt, path=path, size=size, sha256=sha256))
            return
        except IntegrityError:
            existing = session.scalars(
                select(Artifact).where(Artifact.job_id == job.id, Artifact.path == path)
            ).one()
    existing.attempt, existing.size, existing.sha256, existing.created_at = (
        attempt,
        size,
        sha256,
        utcnow(),
    )


def artifacts(session: Session, job: Job) -> list[Artifact]:
    return list(session.scalars(select(Artifact).where(Artifact.job_id == job.id).order_by(Artifact.path)))


def events(session: Session, job: Job) -> list[JobEvent]:
    return list(session.scalars(select(JobEvent).where(JobEvent.job_id == job.id).order_by(JobEvent.id)))


def ack_command(session: Session, cpod_id: str, command_id: int) -> bool:
    result = session.execute(
        update(AgentCommand)
        .where(
            AgentCommand.id == command_id, AgentCommand.cpod_id == cpod_id, AgentCommand.acked_at.is_(None)
        )
        .values(acked_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]
