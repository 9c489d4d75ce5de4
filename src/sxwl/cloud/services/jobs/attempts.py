"""The life of a job attempt once it is placed: the agent's reports through the state machine,
fencing of attempts that are no longer current, stop commands to CPods and their acknowledgement,
requeueing of lost work, and the artifacts an attempt uploads."""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, object_session

from sxwl.cloud.db.models import (
    ACTIVE_STATES,
    TERMINAL_STATES,
    AgentCommand,
    Artifact,
    CPod,
    Job,
    JobAttempt,
    JobState,
)
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.errors import AppError
from sxwl.cloud.kit import metrics
from sxwl.cloud.kit.notify import on_commit
from sxwl.cloud.services.jobs.job_events import add_event
from sxwl.cloud.services.jobs.job_kinds import kind_of
from sxwl.protocol import attempt_key
from sxwl.protocol.reasons import Reason, english

# What an agent may report after each state; terminal states never change (invariant 4, docs/architecture.md).
AGENT_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.ASSIGNED: frozenset({JobState.STARTING, JobState.RUNNING, JobState.LOST} | TERMINAL_STATES),
    JobState.STARTING: frozenset({JobState.RUNNING, JobState.LOST} | TERMINAL_STATES),
    JobState.RUNNING: frozenset({JobState.LOST} | TERMINAL_STATES),
}


def stop_command(
    session: Session,
    job: Job,
    cpod_id: str,
    attempt: int,
    reason: str,
    cancel: bool = False,
    grace_s: float | None = None,
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
        session.add(
            AgentCommand(
                cpod_id=cpod_id, kind=kind, job_id=job.id, attempt=attempt, reason=reason, grace_s=grace_s
            )
        )
        on_commit(session).wake_cpod(cpod_id)


def finish(job: Job, state: JobState, exit_code: int | None = None, reason: Reason | None = None) -> None:
    session = object_session(job)
    if session is not None and (kind := kind_of(job)) is not None:
        state, reason = kind.attempt_ended(session, job, state, reason)
    job.state = state
    job.finished_at = utcnow()
    job.exit_code = exit_code
    job.reason = reason


def close_attempt(
    session: Session, job: Job, outcome: str, *, reported: bool, never_ran: bool = False
) -> None:
    """Closes the current attempt. Its proof of life is fixed now (invariant 9,
    docs/architecture.md): the agent's own report when ``reported``, otherwise the last heartbeat
    that listed it, so a CPod that vanished is paid only for time it proved; ``never_ran``: its
    command never started, so nothing after its start is billed."""
    placed = session.get(JobAttempt, (job.id, job.attempt))
    if placed is None or placed.finished_at is not None:
        return
    placed.finished_at = utcnow()
    placed.outcome = outcome
    if placed.started_at is None:
        return
    if reported:
        placed.proven_until = placed.started_at if never_ran else placed.finished_at
        return
    cpod = session.get(CPod, placed.cpod_id) if placed.cpod_id else None
    if cpod is not None and cpod.last_heartbeat_at and attempt_key(job.id, job.attempt) in cpod.reported_jobs:
        placed.proven_until = max(placed.proven_until or cpod.last_heartbeat_at, cpod.last_heartbeat_at)


def requeue(session: Session, job: Job, why: Reason) -> None:
    """The attempt is lost: queue a new attempt (or give up after max_attempts) and fence the old one."""
    old_cpod, old_attempt = job.cpod_id, job.attempt
    close_attempt(session, job, JobState.LOST.value, reported=False)
    job.state = JobState.LOST
    add_event(session, job, "lost", why)
    if old_cpod is not None:
        stop_command(session, job, old_cpod, old_attempt, f"attempt {old_attempt} was lost: {english(why)}")
    if job.cancel_requested_at is not None:
        finish(job, JobState.CANCELLED, reason=Reason.of("job.cancelled_while_lost"))
        add_event(session, job, "cancelled", job.reason)
    elif job.attempt >= job.max_attempts:
        finish(job, JobState.FAILED, reason=Reason.of("job.lost_times", times=job.attempt, why=why))
        add_event(session, job, "failed", job.reason)
    else:
        job.state = JobState.QUEUED
        job.cpod_id = None
        job.node_names = []
        job.reason = Reason.of("queue.requeued", why=why)
        add_event(session, job, "requeued", why)
        if (kind := kind_of(job)) is not None:
            kind.requeued(session, job, old_attempt, why)
        on_commit(session).wake_scheduler()


def requeue_cpod_jobs(session: Session, cpod_id: str, why: Reason) -> int:
    jobs = session.scalars(
        select(Job).where(Job.cpod_id == cpod_id, Job.state.in_(ACTIVE_STATES)).with_for_update()
    ).all()
    for job in jobs:
        requeue(session, job, why)
    return len(jobs)


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
    session: Session,
    cpod: CPod,
    job_id: str,
    attempt: int,
    state: JobState,
    exit_code: int | None,
    reason: Reason | None,
    *,
    never_ran: bool | None = False,
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
        requeue(session, job, reason or Reason.of("job.not_resumed"))
        return job
    if state in TERMINAL_STATES:
        if job.cancel_requested_at is not None and state in (JobState.FAILED, JobState.CANCELLED):
            state, reason = JobState.CANCELLED, job.cancel_reason or reason or Reason.of("job.cancelled")
        kind = kind_of(job)
        if state == JobState.SUCCEEDED and kind is not None and not kind.ends_by_exiting:
            state = JobState.FAILED
            reason = reason or Reason.of("job.exited_while_serving", status=exit_code, kind=kind.name)
        if reason is None and state == JobState.FAILED and exit_code is not None:
            reason = Reason.of("job.exit_code", code=exit_code)
        close_attempt(session, job, state.value, reported=True, never_ran=bool(never_ran))
        finish(job, state, exit_code, reason)
        state, reason = job.state, job.reason
        on_commit(session).wake_scheduler()
    else:
        if job.state == JobState.ASSIGNED:  # the agent's first word on this attempt
            metrics.observe_dispatch(job.assigned_at)
        job.state = state
        job.reason = None
        if state == JobState.RUNNING:
            job.started_at = utcnow()
            placed = session.get(JobAttempt, (job.id, job.attempt))
            if placed is not None:
                placed.started_at = job.started_at
            if (kind := kind_of(job)) is not None:
                kind.attempt_started(session, job)
    add_event(session, job, state.value, reason)
    return job


class ArtifactExists(AppError):
    """The attempt already stored other bytes at this path: an artifact is written once, so that what
    a fine-tune registered or resumes from never changes under its record (docs/object-storage.md)."""

    def __init__(self, job_id: str, attempt: int, path: str, sha256: str | None = None) -> None:
        held = f" (sha256 {sha256})" if sha256 else ""
        super().__init__(
            409,
            f"{path} of attempt {attempt} of job {job_id} is already stored with other bytes{held}; "
            "an artifact is written once and never replaced",
            code="artifact_exists",
            details={"path": path, "sha256": sha256},
        )


def repeats_recorded(
    session: Session, job: Job, attempt: int, path: str, size: int | None, sha256: str | None
) -> bool:
    """True when ``attempt`` already recorded exactly these bytes at ``path`` (an upload repeated after
    its answer was lost: nothing is stored again); False when it recorded nothing there;
    ``ArtifactExists`` (409) when it recorded other bytes, or when the caller names none to compare."""
    existing = _recorded(session, job.id, path)
    if existing is None or existing.attempt != attempt:
        return False
    if sha256 is None or existing.sha256 != sha256 or size not in (None, existing.size):
        raise ArtifactExists(job.id, attempt, path, existing.sha256)
    return True


def record_artifact(session: Session, job: Job, attempt: int, path: str, size: int, sha256: str) -> None:
    """One row per (job, path). A later attempt's upload of the path replaces an earlier attempt's
    record (its bytes lie at an address of their own, storage/); the same attempt's record is never
    replaced: the same bytes again change nothing, other bytes are ``ArtifactExists``, also when two
    uploads of it are recorded at the same moment (the unique index refuses the second insert)."""
    existing = _recorded(session, job.id, path)
    if existing is None:
        try:
            with session.begin_nested():
                session.add(Artifact(job_id=job.id, attempt=attempt, path=path, size=size, sha256=sha256))
        except IntegrityError:
            existing = session.scalars(
                select(Artifact).where(Artifact.job_id == job.id, Artifact.path == path)
            ).one()
    if existing is not None and existing.attempt == attempt:
        if (existing.size, existing.sha256) != (size, sha256):
            raise ArtifactExists(job.id, attempt, path, existing.sha256)
        return
    if existing is not None:
        existing.attempt, existing.size, existing.sha256, existing.created_at = (
            attempt,
            size,
            sha256,
            utcnow(),
        )
    if (kind := kind_of(job)) is not None:
        kind.artifact_recorded(session, job, attempt, path, size, sha256)


def _recorded(session: Session, job_id: str, path: str) -> Artifact | None:
    return session.scalar(select(Artifact).where(Artifact.job_id == job_id, Artifact.path == path))


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
