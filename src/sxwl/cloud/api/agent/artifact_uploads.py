"""Uploads straight to the object store (docs/object-storage.md). An uploader asks where to put an
artifact's bytes, naming their size and sha256, with the credential it has (the CPod token, or a
pod's upload token); only the job's current attempt, within its upload window
(services/jobs/attempt_window.py), gets an answer, and only for a path it has not stored other bytes at.
With the local store the answer is "through the cloud" (the artifact routes of api/agent/routes.py); with
S3 it is a presigned PUT of exactly those bytes that cannot replace an object, valid no longer than
the window. After the PUT the uploader says so, and the cloud records the artifact only once the
store shows it holds that size and sha256: nothing is recorded that is not there."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, NamedTuple

from fastapi import APIRouter, Depends, Query, Request
from sqlalchemy.orm import Session

from sxwl.cloud.api.agent.routes import (
    UPLOAD_ERRORS,
    CurrentCPod,
    protocol_header,
    recording,
    store_unavailable,
)
from sxwl.cloud.api.deps import Ctx, bearer_token
from sxwl.cloud.api.responses import errors, no_store
from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import Job
from sxwl.cloud.errors import AppError, invalid
from sxwl.cloud.services.catalog import storage_quota
from sxwl.cloud.services.jobs import attempt_window, attempts, upload_tokens
from sxwl.cloud.storage import AlreadyStored, Artifact, NotStored, StoreUnavailable, clean_artifact_path
from sxwl.protocol import ArtifactRecorded, ArtifactUpload, UploadTargetReply, paths
from sxwl.protocol.fields import PosInt32

router = APIRouter(prefix=paths.AGENT, tags=["agent"], responses=errors(400, 401, 403, 422))
JobOf = Callable[[Session], Job]


class Allowed(NamedTuple):
    seconds_left: int  # of the attempt's upload window
    repeat: bool  # the attempt recorded these very bytes at the path already


@router.post(
    paths.UPLOAD_TARGET,
    response_model=UploadTargetReply,
    dependencies=[Depends(no_store)],  # a presigned URL is a credential
    responses=UPLOAD_ERRORS,
)
async def upload_target(
    job_id: str, body: ArtifactUpload, cpod: CurrentCPod, ctx: Ctx, attempt: Annotated[PosInt32, Query()]
) -> UploadTargetReply:
    """Where a CPod's agent puts one artifact of an attempt it runs (the local runtime's outputs)."""
    return await _target(
        ctx, job_id, attempt, body, lambda s: attempts.job_for_agent(s, cpod, job_id, attempt)
    )


@router.post(paths.UPLOAD_DONE, status_code=201, responses=UPLOAD_ERRORS)
async def upload_done(
    job_id: str, body: ArtifactUpload, cpod: CurrentCPod, ctx: Ctx, attempt: Annotated[PosInt32, Query()]
) -> ArtifactRecorded:
    return await _done(ctx, job_id, attempt, body, lambda s: attempts.job_for_agent(s, cpod, job_id, attempt))


@router.post(
    paths.POD_UPLOAD_TARGET,
    response_model=UploadTargetReply,
    dependencies=[Depends(protocol_header), Depends(no_store)],
    responses=UPLOAD_ERRORS,
)
async def pod_upload_target(
    job_id: str, attempt: PosInt32, body: ArtifactUpload, request: Request, ctx: Ctx
) -> UploadTargetReply:
    """Where a Kubernetes pod's uploader puts one artifact, with its attempt's upload token."""
    upload_tokens.check_token(ctx.box, bearer_token(request), job_id, attempt)
    return await _target(ctx, job_id, attempt, body, lambda s: upload_tokens.job_of_token(s, job_id, attempt))


@router.post(
    paths.POD_UPLOAD_DONE,
    status_code=201,
    dependencies=[Depends(protocol_header)],
    responses=UPLOAD_ERRORS,
)
async def pod_upload_done(
    job_id: str, attempt: PosInt32, body: ArtifactUpload, request: Request, ctx: Ctx
) -> ArtifactRecorded:
    upload_tokens.check_token(ctx.box, bearer_token(request), job_id, attempt)
    return await _done(ctx, job_id, attempt, body, lambda s: upload_tokens.job_of_token(s, job_id, attempt))


def _artifact(ctx: CloudContext, job_id: str, attempt: int, body: ArtifactUpload) -> Artifact:
    try:
        clean = clean_artifact_path(body.path)
    except ValueError as exc:
        raise invalid("path", str(exc)) from None
    limit = ctx.settings.artifact_max_bytes
    if body.size > limit:
        raise AppError(
            413, f"artifact larger than {limit} bytes", details={"max_bytes": limit, "path": clean}
        )
    return Artifact(job_id, attempt, clean)


def _allowed(ctx: CloudContext, job_of: JobOf, attempt: int, body: ArtifactUpload, path: str) -> Allowed:
    """Raises unless the credential's attempt may upload these bytes at ``path`` now (404; 409 for a
    stale attempt, a closed window or other bytes it stored there; 413 past the owner's storage
    quota); else how long it may, and whether it recorded these very bytes there already."""
    with ctx.db.session() as session:
        job = job_of(session)
        left = attempt_window.upload_seconds_left(session, job, attempt)
        repeat = attempts.repeats_recorded(session, job, attempt, path, body.size, body.sha256)
        if not repeat:
            storage_quota.check_artifact(session, ctx.settings, job, path, body.size)
        return Allowed(left, repeat)


async def _target(
    ctx: CloudContext, job_id: str, attempt: int, body: ArtifactUpload, job_of: JobOf
) -> UploadTargetReply:
    artifact = _artifact(ctx, job_id, attempt, body)

    allowed = await asyncio.to_thread(_allowed, ctx, job_of, attempt, body, artifact.path)
    try:
        target = await ctx.artifacts.upload_target(artifact, body.size, body.sha256, allowed.seconds_left)
    except StoreUnavailable as exc:
        raise store_unavailable(exc) from None
    except AlreadyStored:
        raise attempts.ArtifactExists(job_id, attempt, artifact.path) from None
    if target is None:
        return UploadTargetReply(via="cloud")
    return UploadTargetReply(
        via="url", url=target.url, headers=target.headers, expires_in_s=target.expires_in_s
    )


async def _done(
    ctx: CloudContext, job_id: str, attempt: int, body: ArtifactUpload, job_of: JobOf
) -> ArtifactRecorded:
    artifact = _artifact(ctx, job_id, attempt, body)
    recorded = ArtifactRecorded(path=artifact.path, size=body.size, sha256=body.sha256)

    if (await asyncio.to_thread(_allowed, ctx, job_of, attempt, body, artifact.path)).repeat:
        return recorded
    try:
        await ctx.artifacts.check_uploaded(artifact, body.size, body.sha256)
    except StoreUnavailable as exc:
        raise store_unavailable(exc) from None
    except NotStored as exc:
        raise AppError(
            409,
            f"{artifact.path} is not uploaded: {exc}; nothing was recorded, upload it again",
            code="artifact_not_uploaded",
            details={"path": artifact.path},
        ) from None

    def save() -> None:
        with ctx.db.session(immediate=True) as session:
            job = job_of(session)
            attempt_window.upload_seconds_left(session, job, attempt)
            storage_quota.check_recorded(session, ctx.settings, job, artifact.path, body.size)
            attempts.record_artifact(session, job, attempt, artifact.path, body.size, body.sha256)

    await recording(ctx, artifact, save)
    return recorded
