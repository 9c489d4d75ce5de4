"""The bytes of a job attempt's log that the database holds, as chunks at byte offsets: the one walk
over them that a user's read (job_logs), the fine-tune progress parser (fine_tune_progress) and the
archiver (log_archive) use, and the archiver's removal of what the store now holds."""

from __future__ import annotations

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from sxwl.cloud.db.models import LogChunk

# The most chunk rows one read loads, whatever their size: a read from the start of a long log
# loads a bounded window and the reader continues from where it stopped.
MAX_CHUNKS = 64


def read_bytes(
    session: Session,
    *,
    job_id: str,
    attempt: int,
    offset: int,
    limit: int,
    max_chunks: int | None = MAX_CHUNKS,
) -> bytes:
    """Up to ``limit`` contiguous bytes from ``offset`` (fewer at the end of what is stored, or past
    ``max_chunks`` rows; None: as many rows as ``limit`` takes)."""
    query = (
        select(LogChunk.offset, LogChunk.data)
        .where(
            LogChunk.job_id == job_id,
            LogChunk.attempt == attempt,
            LogChunk.offset + func.length(LogChunk.data) > offset,
            LogChunk.offset < offset + limit,
        )
        .order_by(LogChunk.offset)
    )
    if max_chunks is not None:
        query = query.limit(max_chunks)
    out = bytearray()
    position = offset
    for start, data in session.execute(query):
        if start > position or len(out) >= limit:
            break
        piece = data[position - start :][: limit - len(out)]
        out += piece
        position += len(piece)
    return bytes(out)


def forget_below(session: Session, *, job_id: str, attempt: int, end: int) -> None:
    """Removes the bytes before ``end``, which the store now holds: whole chunks go, and a chunk that
    straddles ``end`` keeps only its part from there."""
    mine = (LogChunk.job_id == job_id, LogChunk.attempt == attempt)
    gone = delete(LogChunk).where(*mine, LogChunk.offset + func.length(LogChunk.data) <= end)
    session.execute(gone.execution_options(synchronize_session=False))
    straddling = session.scalars(select(LogChunk).where(*mine, LogChunk.offset < end)).all()
    for chunk in straddling:
        chunk.data, chunk.offset = chunk.data[end - chunk.offset :], end
