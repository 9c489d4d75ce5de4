"""A job attempt's log (docs/jobs.en.md, "Logs"): appended by its agent in chunks at byte offsets
(idempotent, gaps refused), kept up to ``log_max_bytes`` (what comes after is dropped, with one line
that says so, and its offsets are still acknowledged), read by users from an offset. Its older part
lies in the artifact store (log_archive), the rest in ``log_chunks``."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from sxwl.cloud.config import Settings
from sxwl.cloud.db.models import TERMINAL_STATES, AttemptLog, Job, LogChunk
from sxwl.cloud.errors import AppError
from sxwl.cloud.kit.notify import on_commit
from sxwl.cloud.services.jobs.job_kinds import kind_of
from sxwl.cloud.services.jobs.log_chunks import read_bytes


def drop_line(cap: int, after_newline: bool) -> bytes:
    """The one line that ends a log over its cap."""
    line = f"[sxwl] this attempt's log reached its limit of {cap} bytes: the rest of its output is dropped\n"
    return (b"" if after_newline else b"\n") + line.encode()


def state_for_append(session: Session, settings: Settings, job_id: str, attempt: int) -> AttemptLog:
    """The attempt's log row, locked until the append commits (created at its first append)."""
    state = session.get(AttemptLog, (job_id, attempt), with_for_update=True)
    if state is None:
        try:
            with session.begin_nested():
                state = AttemptLog(
                    job_id=job_id,
                    attempt=attempt,
                    received=0,
                    kept=0,
                    archived=0,
                    segment_bytes=settings.log_segment_bytes,
                )
                session.add(state)
        except IntegrityError:  # another append created it at this moment
            state = session.get(AttemptLog, (job_id, attempt), with_for_update=True, populate_existing=True)
            assert state is not None
    return state


@dataclass(frozen=True)
class Appended:
    next_offset: int  # where the agent continues
    archive_due: bool  # the database holds enough of the log to move a segment to the store


def append_log(
    session: Session, settings: Settings, job: Job, attempt: int, offset: int, data: bytes
) -> Appended:
    """Idempotent append: bytes already received are skipped, a gap is refused with the expected
    offset. Past the cap the bytes are acknowledged but not kept."""
    state = state_for_append(session, settings, job.id, attempt)
    if offset > state.received:
        raise AppError(
            409,
            f"log offset {offset} is past the end ({state.received}); resend from {state.received}",
            code="log_gap",
            details={"next_offset": state.received},
        )
    fresh = data[state.received - offset :]
    fresh_at = state.received
    kept_before = state.kept
    if fresh and state.dropped_at is None:
        keep = fresh[: max(0, settings.log_max_bytes - state.kept)]
        if keep:
            session.add(LogChunk(job_id=job.id, attempt=attempt, offset=state.kept, data=keep))
            state.kept += len(keep)
        if len(keep) < len(fresh):
            last = keep[-1:] or read_bytes(
                session, job_id=job.id, attempt=attempt, offset=state.kept - 1, limit=1
            )
            line = drop_line(settings.log_max_bytes, last in (b"", b"\n"))
            session.add(LogChunk(job_id=job.id, attempt=attempt, offset=state.kept, data=line))
            state.dropped_at = fresh_at + len(keep)
            state.kept += len(line)
    state.received += len(fresh)
    if state.kept > kept_before:
        on_commit(session).wake_job(job.id)
    if fresh and (kind := kind_of(job)) is not None:
        session.flush()  # the kind reads the log where it is stored, this append included
        kind.log_appended(session, job, attempt, state, fresh_at, fresh)
    return Appended(state.received, state.kept - state.archived >= 2 * state.segment_bytes)


@dataclass(frozen=True)
class LogSlice:
    data: bytes
    next_offset: int
    complete: bool


@dataclass(frozen=True)
class ArchivedRead:
    """A read that starts in the part of the log the store holds: ``log_archive.read`` finishes it."""

    job_id: str
    attempt: int
    offset: int
    segment_bytes: int
    limit: int
    end: int
    finished: bool


def read_log(
    settings: Settings, session: Session, job: Job, attempt: int, offset: int
) -> LogSlice | ArchivedRead:
    """What a reader gets from byte ``offset`` of the kept log."""
    limit = settings.log_read_max_bytes
    # An earlier attempt never grows again; the current one is done when the job is. A queued job's
    # log is not complete: its (next) attempt has yet to run.
    finished = attempt < job.attempt or job.state in TERMINAL_STATES
    state = session.get(AttemptLog, (job.id, attempt))
    if state is None:
        return LogSlice(b"", 0, finished)
    for _ in range(2):
        if offset < state.archived:
            return ArchivedRead(job.id, attempt, offset, state.segment_bytes, limit, state.kept, finished)
        data = read_bytes(session, job_id=job.id, attempt=attempt, offset=offset, limit=limit)
        if data or offset >= state.kept:
            break
        # Nothing where the log has bytes: they moved to the store since the row was read (a
        # database that gives each statement its own snapshot): read the row again.
        session.refresh(state)
    # An offset past the end is answered with the end, where a reader can really continue.
    next_offset = min(offset + len(data), state.kept)
    return LogSlice(data, next_offset, finished and next_offset >= state.kept)
