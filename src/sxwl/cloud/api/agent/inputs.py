"""What an attempt fetches before it starts (docs/finetune.md): a fine-tune's model, files and the
checkpoint it resumes from, for the attempt that is current and has not ended, whichever credential
asks (services/jobs/attempt_window.py). Two credentials reach the same inputs:
the CPod's token (the agent's input cache, runtime "local") and the attempt's upload token (a
Kubernetes pod's init container, ``sxwl.agent.pod_fetcher``: docs/agent.md, "Fine-tunes on
Kubernetes"). The local store streams the bytes; S3 answers with a presigned redirect, which the
clients follow without their token (httpx drops it on that cross-origin hop, the fetcher never sends
it there)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from sqlalchemy.orm import Session

from sxwl.cloud.api.agent.routes import CurrentCPod, protocol_header
from sxwl.cloud.api.deps import Ctx, bearer_token
from sxwl.cloud.api.responses import Responses, errors
from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import Job
from sxwl.cloud.errors import AppError
from sxwl.cloud.services.jobs import attempt_window, attempts, upload_tokens
from sxwl.cloud.storage import Artifact
from sxwl.protocol import SHA256_HEADER, paths
from sxwl.protocol.fields import PosInt32

router = APIRouter(prefix=paths.AGENT, tags=["agent"], responses=errors(400, 401, 403, 422))
INPUT_TYPE = "application/octet-stream"
INPUT_HEADERS = {"Cache-Control": "private, no-store", "X-Content-Type-Options": "nosniff"}
INPUT_RESPONSES: Responses = {
    200: {"content": {INPUT_TYPE: {"schema": {"type": "string", "format": "binary"}}}},
    307: {"description": "a short-lived presigned URL of the object store (docs/object-storage.md)"},
    **errors(404, 409),
}
JobOf = Callable[[Session], Job]


@router.get(paths.JOB_INPUT, response_class=Response, responses=INPUT_RESPONSES)
async def job_input(
    job_id: str, name: str, cpod: CurrentCPod, ctx: Ctx, attempt: Annotated[PosInt32, Query()]
) -> Response:
    """One input of an attempt this CPod runs now, with the CPod token, while the attempt has not
    ended; a stale attempt is 409 and told to stop, an ended one 409 ``inputs_closed``."""
    return await _input(
        ctx, job_id, attempt, name, lambda s: attempts.job_for_agent(s, cpod, job_id, attempt)
    )


@router.get(
    paths.POD_INPUT,
    response_class=Response,
    dependencies=[Depends(protocol_header)],
    responses=INPUT_RESPONSES,
)
async def pod_input(job_id: str, attempt: PosInt32, name: str, request: Request, ctx: Ctx) -> Response:
    """One input of an attempt, with its upload token (a Kubernetes pod's input fetcher), while the
    attempt is current and has not ended; another attempt's token or the CPod token is 403, a stale or
    ended attempt 409."""
    upload_tokens.check_token(ctx.box, bearer_token(request), job_id, attempt)
    return await _input(ctx, job_id, attempt, name, lambda s: upload_tokens.job_of_token(s, job_id, attempt))


async def _input(ctx: CloudContext, job_id: str, attempt: int, name: str, job_of: JobOf) -> Response:
    def find() -> tuple[Artifact, str]:
        with ctx.db.session() as session:
            job = job_of(session)
            attempt_window.check_inputs_open(session, job, attempt)
            return input_object(job, name)

    address, sha256 = await asyncio.to_thread(find)
    return ctx.artifacts.download(address, INPUT_HEADERS | {SHA256_HEADER: sha256}, INPUT_TYPE)


def input_object(job: Job, name: str) -> tuple[Artifact, str]:
    """Where the job's input ``name`` is stored, and its sha256; 404 naming the inputs it has."""
    entry = next((i for i in job.inputs if i["name"] == name), None)
    if entry is None:
        known = ", ".join(i["name"] for i in job.inputs) or "none"
        raise AppError(404, f"job {job.id} has no input {name} (its inputs: {known})")
    where = entry["object"]
    return Artifact(where["job_id"], where["attempt"], where["path"]), entry["sha256"]
