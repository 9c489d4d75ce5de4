"""A fine-tune's events (OpenAI's ``fine_tuning.job.event``): what the cloud and the trainer said
about it, newest first when listed. Shared by creation, the log's progress and the job's outputs."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from sxwl.cloud.db.finetune_models import FineTune, FineTuneEvent
from sxwl.cloud.kit.notify import on_commit
from sxwl.protocol.reasons import Reason


def add(
    session: Session,
    fine_tune: FineTune,
    message: Reason,
    *,
    attempt: int = 0,
    level: str = "info",
    type: str = "message",
    data: dict[str, Any] | None = None,
) -> FineTuneEvent:
    event = FineTuneEvent(
        fine_tune_id=fine_tune.id,
        attempt=attempt,
        level=level,
        type=type,
        message=message,
        data=data,
    )
    session.add(event)
    on_commit(session).wake_job(fine_tune.job_id)  # followers of the job see the fine-tune move too
    return event


def of_job(session: Session, job_id: str) -> FineTune | None:
    """The fine-tune a job runs, or None for an ordinary job."""
    return session.scalar(select(FineTune).where(FineTune.job_id == job_id))
