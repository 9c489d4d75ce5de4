"""What an attempt fetches onto its CPod before it starts (docs/finetune.md): a fine-tune's model,
files and the checkpoint it resumes from, with the CPod's token, for the attempt it runs now. The
local store streams the bytes; S3 answers with a presigned redirect (httpx drops the CPod's token
on that cross-origin hop)."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Query, Response

from sxwl.cloud.api.agent import CurrentCPod
from sxwl.cloud.api.deps import Ctx
from sxwl.cloud.api.responses import errors
from sxwl.cloud.errors import AppError
from sxwl.cloud.services import attempts
from sxwl.cloud.storage import Artifact
from sxwl.protocol import SHA256_HEADER, paths
from sxwl.protocol.fields import PosInt32

router = APIRouter(prefix=paths.AGENT, tags=["agent"], responses=errors(400, 401, 403, 422))
INPUT_TYPE = "application/octet-stream"
INPUT_HEADERS = {"Cache-Control": "private, no-store", "X-Content-Type-Options": "nosniff"}


@router.get(
    paths.JOB_INPUT,
    response_class=Response,
    responses={
        200: {"content": {INPUT_TYPE: {"schema": {"type": "string", "format": "binary"}}}},
        307: {"description": "a short-lived presigned URL of the object store (docs/object-storage.md)"},
        **errors(404, 409),
    },
)
async def job_input(
    job_id: str, name: str, cpod: CurrentCPod, ctx: Ctx, attempt: Annotated[PosInt32, Query()]
) -> Response:
    """One input of an attempt this CPod runs now; a stale attempt is 409 and told to stop."""

    def find() -> tuple[Artifact, str]:
        with ctx.db.session() as session:
            job = attempts.job_for_agent(session, cpod, job_id, attempt)
            entry = next((i for i in job.inputs if i.get("name") == name), None)
            if entry is None:
                known = ", ".join(str(i.get("name")) for i in job.inputs) or "none"
                raise AppError(404, f"job {job_id} has no input {name} (its inputs: {known})")
            where = entry["object"]
            address = Artifact(str(where["job_id"]), int(where["attempt"]), str(where["path"]))
            return address, str(entry["sha256"])

    address, sha256 = await asyncio.to_thread(find)
    return ctx.artifacts.download(address, INPUT_HEADERS | {SHA256_HEADER: sha256}, INPUT_TYPE)
