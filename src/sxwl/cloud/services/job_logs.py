"""A job attempt's log: appended by its agent in chunks at byte offsets (idempotent, gaps refused),
read by users from an offset."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import TERMINAL_STATES, Job, LogChunk
from sxwl.cloud.errors import AppError
from sxwl.cloud.notify import on_commit
from sxwl.cloud.services import fine_tune_progress
from sxwl.cloud.services.log_chunks import log_size, read_bytes


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
        else:
            on_commit(session).wake_job(job.id)
            if job.trainer is not None:
                fine_tune_progress.absorb(session, job, attempt)
    return size + len(fresh)


@dataclass(frozen=True)
class LogSlice:
    data: bytes
    next_offset: int
    complete: bool


def read_log(ctx: CloudContext, session: Session, job: Job, attempt: int, offset: int) -> LogSlice:
    limit = ctx.settings.log_read_max_bytes
    data = read_bytes(session, job_id=job.id, attempt=attempt, offset=offset, limit=limit)
    position = offset + len(data)
    end = log_size(session, job.id, attempt)
    # An earlier attempt never grows again; the current one is done when the job is. A queued job's
    # log is not complete: its (next) attempt has yet to run.
    finished = attempt < job.attempt or job.state in TERMINAL_STATES
    # An offset past the end is answered with the end, where a reader can really continue.
    next_offset = min(position, end)
    return LogSlice(data, next_offset, finished and next_offset >= end)
