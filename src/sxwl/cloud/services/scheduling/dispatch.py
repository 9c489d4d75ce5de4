"""What a CPod's agent is told on its long-poll: new job attempts, and commands to stop attempts."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import ColumnElement, func, select

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import FORGET_WORKSPACE, AgentCommand, Job, JobState
from sxwl.cloud.services.jobs.job_kinds import kind_of
from sxwl.protocol import Assignment, AssignmentsReply, Command


def assignment(ctx: CloudContext, job: Job) -> Assignment:
    """The attempt ``job`` is on, as its CPod's agent receives it, with the largest artifact the
    cloud takes (so that the agent refuses a bigger output before it reads any of it), the most
    an input archive may unpack to (the model limit: a bigger one is refused before unpacking), and
    what the job's workload kind adds."""
    found = Assignment.model_validate(job, from_attributes=True)
    limits = {
        "artifact_max_bytes": ctx.settings.artifact_max_bytes,
        "archive_max_bytes": ctx.settings.model_max_bytes,
    }
    found = found.model_copy(update=limits)
    kind = kind_of(job)
    return kind.handed(ctx.box, job, found) if kind is not None else found


# What a long-poll answers with: a CPod's assigned attempts and its commands not yet acked.
_ASSIGNED = Job.state == JobState.ASSIGNED
_UNACKED: ColumnElement[bool] = AgentCommand.acked_at.is_(None)


@dataclass(frozen=True)
class News:
    cpods: set[str]  # CPods whose long-poll would now be answered with something
    commands_seen: int  # the highest command id read


def last_command(ctx: CloudContext) -> int:
    """The highest command id so far (0 with none): where ``news`` starts."""
    return ctx.db.scalar(select(func.max(AgentCommand.id))) or 0


def news(ctx: CloudContext, commands_seen: int) -> News:
    """What a write by another process on SQLite can have given the held long-polls to say, read
    once for all of them (background/sqlite_watch.py): every CPod with an attempt assigned, and
    those of the commands added after ``commands_seen`` and not yet acked. On SQLite one writer
    commits at a time, so command ids grow in commit order and a command added later has a higher
    id; an assignment lasts only until its agent reports it starting, so few are ever pending."""
    with ctx.db.session() as session:
        assigned = session.scalars(select(Job.cpod_id).where(_ASSIGNED).distinct()).all()
        # One statement, so the highest id and the commands come from one snapshot.
        added = session.execute(
            select(AgentCommand.id, AgentCommand.cpod_id, _UNACKED).where(AgentCommand.id > commands_seen)
        ).all()
    cpods = {cpod for cpod in assigned if cpod is not None} | {cpod for _, cpod, unacked in added if unacked}
    return News(cpods, max((id_ for id_, _, _ in added), default=commands_seen))


def pending(ctx: CloudContext, cpod_id: str) -> AssignmentsReply:
    """Assigned attempts stay pending until the agent reports them starting; commands until acked."""
    with ctx.db.session() as session:
        jobs = session.scalars(
            select(Job).where(Job.cpod_id == cpod_id, _ASSIGNED).order_by(Job.assigned_at)
        ).all()
        commands = session.scalars(
            select(AgentCommand).where(AgentCommand.cpod_id == cpod_id, _UNACKED).order_by(AgentCommand.id)
        ).all()
        return AssignmentsReply(
            assignments=[assignment(ctx, job) for job in jobs],
            commands=[
                Command(
                    id=c.id,
                    kind="forget_workspace" if c.kind == FORGET_WORKSPACE else "stop",
                    job_id=c.job_id,
                    attempt=c.attempt,
                    cancel=c.kind == "cancel",
                    reason=c.reason,
                    grace_s=c.grace_s,
                    workspace=c.workspace,
                )
                for c in commands
            ],
        )
