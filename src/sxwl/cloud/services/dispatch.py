"""What a CPod's agent is told on its long-poll: new job attempts, and commands to stop attempts."""

from __future__ import annotations

from sqlalchemy import select

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import AgentCommand, Job, JobState
from sxwl.protocol import Assignment, AssignmentsReply, Command


def assignment(job: Job, artifact_max_bytes: int, archive_max_bytes: int) -> Assignment:
    """The attempt ``job`` is on, as its CPod's agent receives it, with the largest artifact the
    cloud takes (so that the agent refuses a bigger output before it reads any of it) and the most
    an input archive may unpack to (the model limit: a bigger one is refused before unpacking)."""
    found = Assignment.model_validate(job, from_attributes=True)
    limits = {"artifact_max_bytes": artifact_max_bytes, "archive_max_bytes": archive_max_bytes}
    return found.model_copy(update=limits)


def pending(ctx: CloudContext, cpod_id: str) -> AssignmentsReply:
    """Assigned attempts stay pending until the agent reports them starting; commands until acked."""
    with ctx.db.session() as session:
        jobs = session.scalars(
            select(Job)
            .where(Job.cpod_id == cpod_id, Job.state == JobState.ASSIGNED)
            .order_by(Job.assigned_at)
        ).all()
        commands = session.scalars(
            select(AgentCommand)
            .where(AgentCommand.cpod_id == cpod_id, AgentCommand.acked_at.is_(None))
            .order_by(AgentCommand.id)
        ).all()
        return AssignmentsReply(
            assignments=[
                assignment(job, ctx.settings.artifact_max_bytes, ctx.settings.model_max_bytes) for job in jobs
            ],
            commands=[
                Command(
                    id=c.id,
                    kind="stop",
                    job_id=c.job_id,
                    attempt=c.attempt,
                    cancel=c.kind == "cancel",
                    reason=c.reason,
                    grace_s=c.grace_s,
                )
                for c in commands
            ],
        )
