"""Uploaded files (training and validation JSONL), private to their owner: stored in the artifact
store at ``Artifact("files", 0, <file id>)`` and validated in the same pass that hashes and writes
them (docs/finetune.md, "1. Prepare a dataset")."""

from __future__ import annotations

import asyncio
import logging
import secrets
import unicodedata
from collections.abc import AsyncIterator, Sequence

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.finetune_models import DataFile, FileStatus, FineTune
from sxwl.cloud.errors import AppError, invalid
from sxwl.cloud.services.catalog import storage_quota
from sxwl.cloud.services.finetune.dataset_checks import JsonlChecker, Problem, Verdict
from sxwl.cloud.storage import Artifact, StoreUnavailable, TooLarge

log = logging.getLogger("sxwl.cloud.datasets")

FILES_JOB = "files"  # the store's reserved job id for uploaded files (never a real job's 32 hex)
PURPOSES = ("fine-tune",)
FILENAME_MAX = 255


def new_file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


def artifact_of(file: DataFile) -> Artifact:
    return Artifact(job_id=FILES_JOB, attempt=0, path=file.id)


def object_of(file: DataFile) -> dict[str, object]:
    """The store address as a job input's ``object`` (docs/finetune.md)."""
    return {"job_id": FILES_JOB, "attempt": 0, "path": file.id}


def clean_filename(raw: str) -> str:
    """The name a browser or client sent, as shown back: its last path part, without control
    characters (which PostgreSQL and terminals take badly), bounded."""
    name = raw.replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(c for c in name if unicodedata.category(c)[0] != "C").strip()
    return name[:FILENAME_MAX] or "upload.jsonl"


def check_purpose(purpose: str) -> str:
    if purpose not in PURPOSES:
        raise invalid("purpose", f"must be one of: {', '.join(PURPOSES)}")
    return purpose


async def upload(
    ctx: CloudContext, *, owner_id: str, filename: str, purpose: str, chunks: AsyncIterator[bytes]
) -> DataFile:
    """Streams ``chunks`` into the store, hashing and validating them as they pass, then records the
    file: ``processed`` when every line is a valid example of one format, else ``error`` with its
    problems. 413 past ``file_max_bytes`` or past the owner's storage quota, with nothing stored or
    recorded."""
    check_purpose(purpose)
    file_id = new_file_id()
    checker = JsonlChecker()

    def usage() -> storage_quota.StorageUsage:
        with ctx.db.session() as session:
            return storage_quota.usage(session, ctx.settings, owner_id)

    async def checked() -> AsyncIterator[bytes]:
        async for chunk in chunks:
            if chunk:
                await asyncio.to_thread(checker.feed, chunk)
                yield chunk

    found = await asyncio.to_thread(usage)
    limit = ctx.settings.file_max_bytes
    room = found.room
    artifact = Artifact(job_id=FILES_JOB, attempt=0, path=file_id)
    try:
        size, digest = await ctx.artifacts.put(
            artifact, checked(), limit if room is None else min(limit, room)
        )
    except TooLarge:
        if room is not None and room < limit:
            raise storage_quota.exceeded(found, room + 1, at_least=True) from None
        raise AppError(413, f"file larger than {limit} bytes", details={"max_bytes": limit}) from None
    except StoreUnavailable as exc:
        raise AppError(
            503, f"{exc}; nothing was recorded, try again later", code="store_unavailable"
        ) from None
    verdict = checker.finish()
    row = DataFile(
        id=file_id,
        owner_id=owner_id,
        purpose=purpose,
        filename=clean_filename(filename),
        bytes=size,
        sha256=digest,
        status=FileStatus.PROCESSED if verdict.valid else FileStatus.ERROR,
        format=verdict.format,
        examples=verdict.examples,
        problems=[p.as_dict() for p in verdict.problems],
        problem_count=verdict.problem_count,
    )

    def record() -> DataFile:
        with ctx.db.session(immediate=True) as session:
            storage_quota.lock_owner(session, owner_id)
            storage_quota.require(storage_quota.usage(session, ctx.settings, owner_id), size)
            session.add(row)
        return row

    try:
        return await asyncio.to_thread(record)
    except AppError:
        await _discard(ctx, artifact)
        raise


async def _discard(ctx: CloudContext, artifact: Artifact) -> None:
    """Removes bytes that were stored for a file then refused: no row will ever point to them."""
    try:
        await ctx.artifacts.delete(artifact)
    except StoreUnavailable as exc:
        log.warning("refused file %s is still in the store: %s", artifact.path, exc)


def status_details(file: DataFile) -> str | None:
    """OpenAI's one-line reason for an ``error`` file: its first problem, and how many follow."""
    if file.status != FileStatus.ERROR or not file.problems:
        return None
    first = Problem.of(file.problems[0])
    where = f"line {first.line}: " if first.line else ""
    more = file.problem_count - 1
    return f"{where}{first.message}" + (f" (and {more} more problem(s))" if more > 0 else "")


def verdict_of(file: DataFile) -> Verdict:
    problems = [Problem.of(p) for p in file.problems]
    return Verdict(file.format, file.examples, problems, file.problem_count)


def get(session: Session, *, owner_id: str, file_id: str) -> DataFile:
    """The owner's file; another owner's is as missing as one that never was (404)."""
    file = session.get(DataFile, file_id)
    if file is None or file.owner_id != owner_id:
        raise AppError(404, f"file {file_id} not found")
    return file


def list_for(
    session: Session, *, owner_id: str, after: str | None, limit: int
) -> tuple[Sequence[DataFile], bool]:
    """The owner's files, newest first, ``limit`` of them after the file ``after``; and whether more
    follow."""
    query = select(DataFile).where(DataFile.owner_id == owner_id)
    if after is not None:
        cursor = session.get(DataFile, after)
        if cursor is None or cursor.owner_id != owner_id:
            raise invalid("after", f"no file {after} to continue after")
        query = query.where(
            or_(
                DataFile.created_at < cursor.created_at,
                and_(DataFile.created_at == cursor.created_at, DataFile.id < cursor.id),
            )
        )
    rows = session.scalars(
        query.order_by(DataFile.created_at.desc(), DataFile.id.desc()).limit(limit + 1)
    ).all()
    return rows[:limit], len(rows) > limit


def _forget(session: Session, *, owner_id: str, file_id: str) -> DataFile:
    """Deletes the file's row; 409 while a fine-tune names it (its history must stay readable)."""
    file = get(session, owner_id=owner_id, file_id=file_id)
    used = session.scalars(
        select(FineTune.id)
        .where(or_(FineTune.training_file == file_id, FineTune.validation_file == file_id))
        .limit(1)
    ).first()
    if used is not None:
        raise AppError(
            409,
            f"file {file_id} is used by fine-tune {used}",
            code="file_in_use",
            details={"fine_tune": used},
        )
    session.delete(file)
    return file


async def delete(ctx: CloudContext, *, owner_id: str, file_id: str) -> None:
    """Forgets the file, then removes its bytes from the store. In that order: a store that fails
    (or a cloud that stops) between the two leaves bytes no row points to, never a row without its
    bytes; the failure is logged, and the answer is still that the file is deleted."""

    def forget() -> DataFile:
        with ctx.db.session() as session:
            return _forget(session, owner_id=owner_id, file_id=file_id)

    file = await asyncio.to_thread(forget)
    try:
        await ctx.artifacts.delete(artifact_of(file))
    except StoreUnavailable as exc:
        log.warning("file %s forgotten but its bytes are still in the store: %s", file_id, exc)


def content(session: Session, *, owner_id: str, file_id: str) -> Artifact:
    """Where the owner's file lies in the store, for ``ArtifactStore.download``."""
    return artifact_of(get(session, owner_id=owner_id, file_id=file_id))


def usable(session: Session, *, owner_id: str, file_id: str, field: str) -> DataFile:
    """A file the owner's fine-tune may train on: theirs and ``processed``; else a 422 naming
    ``field`` (``training_file``, ``validation_file``) that says why."""
    file = session.get(DataFile, file_id)
    if file is None or file.owner_id != owner_id:
        raise invalid(field, f"no file {file_id}")
    if file.status != FileStatus.PROCESSED:
        raise invalid(field, f"file {file_id} has problems ({status_details(file)}); upload a corrected one")
    return file
