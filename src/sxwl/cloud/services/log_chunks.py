"""The bytes of a job attempt's log, stored as chunks at byte offsets: the one walk over them that
both a user's read (job_logs) and the fine-tune progress parser (fine_tune_progress) use."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sxwl.cloud.db.models import LogChunk

# The most chunk rows one read loads, whatever their size: a read from the start of a long log
# loads a bounded window and the reader continues from where it stopped.
MAX_CHUNKS = 64


def log_size(session: Session, job_id: str, attempt: int) -> int:
    last = session.execute(
        select(LogChunk.offset, func.length(LogChunk.data))
        .where(LogChunk.job_id == job_id, LogChunk.attempt == attempt)
        .order_by(LogChunk.offset.desc())
        .limit(1)
    ).first()
    return int(last[0] + last[1]) if last else 0


def read_bytes(session: Session, *, job_id: str, attempt: int, offset: int, limit: int) -> bytes:
    """Up to ``limit`` contiguous bytes from ``offset`` (fewer at the end of what is stored)."""
    rows = session.execute(
        select(LogChunk.offset, LogChunk.data)
        .where(
            LogChunk.job_id == job_id,
            LogChunk.attempt == attempt,
            LogChunk.offset + func.length(LogChunk.data) > offset,
        )
        .order_by(LogChunk.offset)
        .limit(MAX_CHUNKS)
    ).all()
    out = bytearray()
    position = offset
    for start, data in rows:
        if start > position or len(out) >= limit:
            break
        piece = data[position - start :][: limit - len(out)]
        out += piece
        position += len(piece)
    return bytes(out)
