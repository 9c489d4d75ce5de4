"""The older part of a job attempt's log, in the artifact store (docs/jobs.en.md, "Logs"): once the
database holds two segments of an attempt's log, the oldest one moves to the store, so a long run's
log leaves at most two segments in ``log_chunks``. Segment k holds the bytes [k·S, (k+1)·S) of the
kept log (S: the attempt's ``segment_bytes``) at ``Artifact("logs", 0, "<job>/<attempt>/<k>")``.

A segment is written to the store first and forgotten by the database after, in a transaction that
moves the attempt's ``archived`` mark only from where it was read: two archivers of one attempt
write the same bytes to the same object, and only one of them moves the mark."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import AttemptLog
from sxwl.cloud.services.jobs.job_logs import ArchivedRead, LogSlice
from sxwl.cloud.services.jobs.log_chunks import forget_below, read_bytes
from sxwl.cloud.storage import Artifact, NotStored, StoreUnavailable

log = logging.getLogger("sxwl.cloud.kit.logs")

LOGS_JOB = "logs"  # the store's reserved job id for logs (never a real job's 32 hex)
# The most segments one call moves: an append adds at most a chunk (log_chunk_max_bytes), so one is
# usually all there is; more wait for the next append.
MAX_SEGMENTS_PER_CALL = 4


def segment(job_id: str, attempt: int, index: int) -> Artifact:
    return Artifact(job_id=LOGS_JOB, attempt=0, path=f"{job_id}/{attempt}/{index}")


async def archive(ctx: CloudContext, job_id: str, attempt: int) -> None:
    """Moves the attempt's oldest segments to the store while the database holds two or more. A
    store that does not answer leaves them in the database, for a later append to move."""
    for _ in range(MAX_SEGMENTS_PER_CALL):
        due = await asyncio.to_thread(_due, ctx, job_id, attempt)
        if due is None:
            return
        index, data = due
        try:
            await ctx.artifacts.put(segment(job_id, attempt, index), _once(data), len(data))
        except StoreUnavailable as exc:
            log.warning("log of job %s attempt %s stays in the database for now: %s", job_id, attempt, exc)
            return
        if not await asyncio.to_thread(_forget, ctx, job_id, attempt, index, len(data)):
            return


def _due(ctx: CloudContext, job_id: str, attempt: int) -> tuple[int, bytes] | None:
    with ctx.db.session() as session:
        state = session.get(AttemptLog, (job_id, attempt))
        if state is None or state.kept - state.archived < 2 * state.segment_bytes:
            return None
        size = state.segment_bytes
        data = read_bytes(
            session, job_id=job_id, attempt=attempt, offset=state.archived, limit=size, max_chunks=None
        )
        if len(data) < size:  # another archiver moved it meanwhile
            return None
        return state.archived // size, data


def _forget(ctx: CloudContext, job_id: str, attempt: int, index: int, size: int) -> bool:
    """Moves the mark past segment ``index`` and drops its chunks, if the mark is still before it."""
    with ctx.db.session(immediate=True) as session:
        state = session.get(AttemptLog, (job_id, attempt), with_for_update=True)
        if state is None or state.archived != index * size:
            return False
        state.archived = (index + 1) * size
        forget_below(session, job_id=job_id, attempt=attempt, end=state.archived)
        return True


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def read(ctx: CloudContext, where: ArchivedRead) -> LogSlice:
    """What a reader gets from an offset the store holds: the rest of that segment, up to the limit."""
    index, within = divmod(where.offset, where.segment_bytes)
    length = min(where.limit, where.segment_bytes - within)
    try:
        data = await ctx.artifacts.read(segment(where.job_id, where.attempt, index), within, length)
    except NotStored:
        data = b""
    if not data:
        # A segment the store lost (or one removed by hand) is skipped, not a reader stuck for ever.
        log.warning("log segment %s of job %s attempt %s is missing", index, where.job_id, where.attempt)
        return LogSlice(b"", min((index + 1) * where.segment_bytes, where.end), False)
    next_offset = where.offset + len(data)
    return LogSlice(data, next_offset, where.finished and next_offset >= where.end)
