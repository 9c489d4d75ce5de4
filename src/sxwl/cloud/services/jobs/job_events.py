"""A job's history: what happened to it and to each attempt, written by every change of state and
shown on the job page and by ``GET /api/v1/jobs/{id}``."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from sxwl.cloud.db.models import Job, JobEvent
from sxwl.cloud.kit.notify import on_commit
from sxwl.protocol.reasons import Reason


def add_event(session: Session, job: Job, kind: str, detail: Reason | None = None) -> None:
    add_event_for(session, job.id, job.attempt, kind, detail)


def add_event_for(
    session: Session, job_id: str, attempt: int, kind: str, detail: Reason | None = None
) -> None:
    session.add(JobEvent(job_id=job_id, attempt=attempt, kind=kind, detail=detail))
    on_commit(session).wake_job(job_id)  # its followers, on every replica


def events(session: Session, job: Job) -> list[JobEvent]:
    return list(session.scalars(select(JobEvent).where(JobEvent.job_id == job.id).order_by(JobEvent.id)))
