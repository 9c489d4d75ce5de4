"""Jobs as their users see them: submit, list, follow, cancel, download results."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Annotated

from fastapi import APIRouter, Query, Response
from sqlalchemy.orm import Session

from sxwl.cloud.api.deps import Ctx, CurrentUser
from sxwl.cloud.api.responses import SIGNED_IN, WITH_BODY, errors
from sxwl.cloud.api.schemas import ArtifactOut, JobEventOut, JobOut, JobPageOut
from sxwl.cloud.db.models import Job, JobState
from sxwl.cloud.errors import AppError, invalid
from sxwl.cloud.services.jobs import job_events, job_logs, jobs, log_archive
from sxwl.cloud.services.money import billing
from sxwl.cloud.storage import Artifact, StoreUnavailable, clean_artifact_path
from sxwl.protocol.fields import NonNegInt64, PosInt32
from sxwl.protocol.jobs import JobIn
from sxwl.protocol.reasons import english

router = APIRouter(prefix="/jobs", tags=["jobs"], responses=SIGNED_IN)
NOT_FOUND = errors(404)
# Artifacts are whatever a job wrote: served as bytes to save, never as a page of the console's
# origin. Octet-stream and attachment keep browsers from rendering them (an HTML or SVG artifact
# would otherwise run its scripts with the console's cookies); nosniff stops them guessing the type
# back; the sandboxing CSP holds even where one renders it anyway (docs/architecture.md, "Input at
# the boundary").
ARTIFACT_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'none'; sandbox",
    "Cache-Control": "private, no-store",
}
ARTIFACT_TYPE = "application/octet-stream"


def job_outs(session: Session, page: Sequence[Job]) -> list[JobOut]:
    """The jobs as the API shows them; queue positions for all of them in one query."""
    positions = jobs.queue_positions(session, page)
    return [_out(job, positions.get(job.id)) for job in page]


# Read from the row's attributes without validating them again: they were judged on the way in, and a
# rule added since (say, no control characters in names) must not make an older job unreadable.
_COMPUTED = ("owner_email", "queue_position", "cost", "cost_per_hour")
_COLUMNS = tuple(name for name in JobOut.model_fields if name not in _COMPUTED)


def _out(job: Job, queue_position: int | None) -> JobOut:
    values = {name: getattr(job, name) for name in _COLUMNS}
    values["reason"] = english(job.reason)  # the row keeps a code
    return JobOut.model_construct(**values, owner_email=job.owner.email, queue_position=queue_position)


def job_out(session: Session, job: Job) -> JobOut:
    (out,) = job_outs(session, [job])
    return out


@router.post("", status_code=201, response_model=JobOut, responses=WITH_BODY | errors(402))
def submit(body: JobIn, user: CurrentUser, ctx: Ctx) -> JobOut:
    with ctx.db.session() as session:
        job = jobs.submit(ctx, session, session.merge(user), body)
        out = job_out(session, job)
    return out


@router.get("", response_model=JobPageOut)
def list_jobs(
    user: CurrentUser,
    ctx: Ctx,
    state: Annotated[list[JobState] | None, Query()] = None,
    q: Annotated[str, Query(max_length=100)] = "",
    page: Annotated[PosInt32, Query()] = 1,
    per_page: Annotated[int, Query(ge=1, le=200)] = 50,
    all: Annotated[bool, Query(description="admins: every user's jobs")] = False,
) -> JobPageOut:
    with ctx.db.session() as session:
        result = jobs.list_for(session, user, page, per_page, state, q, everyone=all)
        return JobPageOut(
            items=job_outs(session, result.items),
            total=result.total,
            page=page,
            per_page=per_page,
        )


@router.get("/{job_id}", response_model=JobOut, responses=NOT_FOUND)
def get_job(job_id: str, user: CurrentUser, ctx: Ctx) -> JobOut:
    with ctx.db.session() as session:
        job = jobs.get_for(session, user, job_id)
        out = job_out(session, job)
        so_far = billing.job_cost(session, job)
        out.cost, out.cost_per_hour = so_far.cost, so_far.per_hour
        return out


@router.post("/{job_id}/cancel", response_model=JobOut, responses=errors(404, 409))
def cancel(job_id: str, user: CurrentUser, ctx: Ctx) -> JobOut:
    """Queued jobs end at once; running ones are stopped by their agent (SIGTERM, then SIGKILL)."""
    with ctx.db.session() as session:
        return job_out(session, jobs.cancel(session, session.merge(user), job_id))


@router.get("/{job_id}/events", response_model=list[JobEventOut], responses=NOT_FOUND)
def list_job_events(job_id: str, user: CurrentUser, ctx: Ctx) -> list[JobEventOut]:
    with ctx.db.session() as session:
        job = jobs.get_for(session, user, job_id)
        return [
            JobEventOut(at=e.at, attempt=e.attempt, kind=e.kind, detail=english(e.detail))
            for e in job_events.events(session, job)
        ]


@router.get(
    "/{job_id}/logs",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}, **NOT_FOUND, **errors(503)},
)
async def read_job_log(
    job_id: str,
    user: CurrentUser,
    ctx: Ctx,
    offset: Annotated[NonNegInt64, Query()] = 0,
    attempt: Annotated[PosInt32 | None, Query(description="default: the latest")] = None,
    wait: Annotated[
        float, Query(ge=0, allow_inf_nan=False, description="seconds to hold the request until output comes")
    ] = 0,
) -> Response:
    """Output from byte ``offset``; ``X-Next-Offset`` is where to continue, ``X-Log-Complete`` says
    whether more can come. With ``wait``, a read that finds nothing new waits for the job's next
    output or change of state, on whichever replica it happens (docs/replicas.md)."""

    def read_rows() -> tuple[int, job_logs.LogSlice | job_logs.ArchivedRead]:
        with ctx.db.session() as session:
            job = jobs.get_for(session, user, job_id)
            chosen = attempt or max(job.attempt, 1)
            if chosen > max(job.attempt, 1):
                raise invalid("attempt", f"job has {job.attempt} attempt(s)")
            return chosen, job_logs.read_log(ctx.settings, session, job, chosen, offset)

    async def read() -> tuple[int, job_logs.LogSlice]:
        chosen, piece = await asyncio.to_thread(read_rows)
        if isinstance(piece, job_logs.ArchivedRead):  # the log's older part, in the store
            try:
                return chosen, await log_archive.read(ctx, piece)
            except StoreUnavailable as exc:
                raise AppError(503, f"{exc}; try again later", code="store_unavailable") from None
        return chosen, piece

    loop = asyncio.get_running_loop()
    deadline = loop.time() + min(wait, ctx.settings.longpoll_max_s)
    event = ctx.notifier.job_waiter(job_id)
    try:
        while True:
            event.clear()  # before reading, so that output arriving during the read is not missed
            chosen, piece = await read()
            remaining = deadline - loop.time()
            if piece.data or piece.complete or remaining <= 0 or ctx.notifier.stopping:
                break
            reread = ctx.notifier.reread_s(ctx.settings.longpoll_backstop_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout=min(remaining, reread))
    finally:
        ctx.notifier.forget_job(job_id, event)
    return Response(
        piece.data,
        media_type="text/plain; charset=utf-8",
        headers={
            "X-Next-Offset": str(piece.next_offset),
            "X-Log-Complete": "true" if piece.complete else "false",
            "X-Attempt": str(chosen),
        },
    )


@router.get("/{job_id}/artifacts", response_model=list[ArtifactOut], responses=NOT_FOUND)
def list_artifacts(job_id: str, user: CurrentUser, ctx: Ctx) -> list[ArtifactOut]:
    with ctx.db.session() as session:
        job = jobs.get_for(session, user, job_id)
        return [
            ArtifactOut(path=a.path, size=a.size, sha256=a.sha256, attempt=a.attempt)
            for a in jobs.artifacts(session, job)
        ]


@router.get(
    "/{job_id}/artifacts/{path:path}",
    response_class=Response,
    responses={
        200: {"content": {ARTIFACT_TYPE: {"schema": {"type": "string", "format": "binary"}}}},
        307: {"description": "a short-lived presigned URL of the object store (docs/object-storage.md)"},
        **NOT_FOUND,
    },
)
def download_artifact(job_id: str, path: str, user: CurrentUser, ctx: Ctx) -> Response:
    try:
        clean = clean_artifact_path(path)
    except ValueError as exc:
        raise invalid("path", str(exc)) from None
    with ctx.db.session() as session:
        job = jobs.get_for(session, user, job_id)
        stored = next((a for a in jobs.artifacts(session, job) if a.path == clean), None)
        if stored is None:
            raise AppError(404, f"job {job_id} has no artifact {clean}")
        artifact = Artifact(job_id, stored.attempt, clean)
    return ctx.artifacts.download(artifact, ARTIFACT_HEADERS, ARTIFACT_TYPE)
