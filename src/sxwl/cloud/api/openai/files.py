"""OpenAI-compatible files (``/v1/files``): training and validation JSONL, private to their owner,
validated line by line on upload (docs/finetune.md, "1. Prepare a dataset")."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from sxwl.cloud.api.deps import Ctx, CurrentUser
from sxwl.cloud.api.jobs import ARTIFACT_HEADERS, ARTIFACT_TYPE
from sxwl.cloud.api.openai.catalog_schemas import FileDeletedOut, FileListOut, FileOut, file_out
from sxwl.cloud.api.responses import SIGNED_IN, WITH_BODY, Responses, errors
from sxwl.cloud.api.uploads import MULTIPART_SLACK, CallerRoom, multipart_body, read_upload
from sxwl.cloud.edge.body_rules import body_rule
from sxwl.cloud.services.finetune import datasets

router = APIRouter(prefix="/files", tags=["files"], responses=SIGNED_IN)
NOT_FOUND = errors(404)
DOWNLOAD: Responses = {
    200: {"content": {ARTIFACT_TYPE: {"schema": {"type": "string", "format": "binary"}}}},
    307: {"description": "Redirect to the object store (S3), where the bytes are served"},
}


FILE_FIELDS = {"purpose": (32, '"fine-tune"')}
FILE_FORM = multipart_body("JSONL: one chat or prompt/completion example a line", FILE_FIELDS)


@router.post("", response_model=FileOut, responses=WITH_BODY | errors(503), openapi_extra=FILE_FORM)
@body_rule(lambda s: (s.file_max_bytes + MULTIPART_SLACK, s.artifact_upload_timeout_s))
async def create_file(request: Request, room: CallerRoom, ctx: Ctx) -> FileOut:
    """Stores the file and reports its validation: ``status`` ``processed`` when every line is a
    valid example, else ``error`` with the lines that are wrong in ``validation.problems``. The
    caller and their storage quota are checked before the body is read."""
    upload = await read_upload(request, FILE_FIELDS, room)
    try:
        stored = await datasets.upload(
            ctx,
            owner_id=room.owner_id,
            filename=upload.file.filename or "",
            purpose=upload.text("purpose"),
            chunks=upload.chunks(),
        )
    finally:
        await upload.file.close()
    return file_out(stored)


@router.get("", response_model=FileListOut)
def list_files(
    user: CurrentUser,
    ctx: Ctx,
    after: Annotated[
        str | None, Query(max_length=40, description="the last file id of the page before")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 20,
) -> FileListOut:
    with ctx.db.session() as session:
        rows, more = datasets.list_for(session, owner_id=user.id, after=after, limit=limit)
        return FileListOut(data=[file_out(f) for f in rows], has_more=more)


@router.get("/{file_id}", response_model=FileOut, responses=NOT_FOUND)
def get_file(file_id: str, user: CurrentUser, ctx: Ctx) -> FileOut:
    with ctx.db.session() as session:
        return file_out(datasets.get(session, owner_id=user.id, file_id=file_id))


@router.delete("/{file_id}", response_model=FileDeletedOut, responses=errors(404, 409))
async def delete_file(file_id: str, user: CurrentUser, ctx: Ctx) -> FileDeletedOut:
    """Forgets the file and removes its bytes from the store; 409 while a fine-tune uses it."""
    await datasets.delete(ctx, owner_id=user.id, file_id=file_id)
    return FileDeletedOut(id=file_id, deleted=True)


@router.get("/{file_id}/content", response_class=Response, responses=DOWNLOAD | NOT_FOUND)
def file_content(file_id: str, user: CurrentUser, ctx: Ctx) -> Response:
    """The file's bytes as uploaded (a redirect to them with the S3 store)."""
    with ctx.db.session() as session:
        artifact = datasets.content(session, owner_id=user.id, file_id=file_id)
    return ctx.artifacts.download(artifact, dict(ARTIFACT_HEADERS), ARTIFACT_TYPE)
