"""Multipart uploads that their endpoint reads itself, once its caller and the caller's storage quota
have been checked.

FastAPI parses a body it declares (``File``, ``Form``, a model) before it resolves the endpoint's
dependencies: an anonymous 200 MiB upload was spooled to disk before its 401. So a route with a large
body (a ``body_rule``) declares none (``body_rules.BodyRules`` refuses one that does), documents its
form with :func:`multipart_body`, and reads it with :func:`read_upload` after its dependencies ran."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from sxwl.cloud.api.deps import Ctx, CurrentUser
from sxwl.cloud.context import CloudContext
from sxwl.cloud.errors import AppError, invalid
from sxwl.cloud.services.catalog import storage_quota

# The multipart envelope around the file (boundaries, part headers, the small fields).
MULTIPART_SLACK = 1024 * 1024
READ_CHUNK = 1024 * 1024
# Fields a client may send beside those an endpoint reads (ignored), before the form is refused.
EXTRA_FIELDS = 8


# A form's text fields: name → (most characters, description).
FormFields = Mapping[str, tuple[int, str]]


def multipart_body(file_description: str, fields: FormFields) -> dict[str, Any]:
    """The OpenAPI ``requestBody`` of a form with one ``file`` and the text ``fields``, for the
    route's ``openapi_extra``."""
    properties: dict[str, Any] = {
        "file": {"type": "string", "format": "binary", "description": file_description},
        **{
            name: {"type": "string", "maxLength": most, "description": description}
            for name, (most, description) in fields.items()
        },
    }
    schema = {"type": "object", "properties": properties, "required": ["file", *fields]}
    return {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": schema}}}}


def declared_length(request: Request) -> int | None:
    value = request.headers.get("content-length", "")
    return int(value) if value.isascii() and value.isdigit() else None


def storage_room(ctx: CloudContext, owner_id: str, declared: int | None) -> Room:
    """The owner's room in their storage quota; a body declared larger than the room (less the
    envelope) is refused now, before it is read."""
    with ctx.db.session() as session:
        found = storage_quota.usage(session, ctx.settings, owner_id)
    if declared is not None:
        storage_quota.require(found, max(0, declared - MULTIPART_SLACK))
    return Room(owner_id, found)


@dataclass(frozen=True)
class Room:
    """What the caller keeps in the store, and so what more fits."""

    owner_id: str
    usage: storage_quota.StorageUsage


def caller_room(request: Request, user: CurrentUser, ctx: Ctx) -> Room:
    """The signed-in caller's room, after their credentials: 413 for a declared size that cannot fit."""
    return storage_room(ctx, user.id, declared_length(request))


CallerRoom = Annotated[Room, Depends(caller_room)]


@dataclass(frozen=True)
class Upload:
    file: UploadFile
    fields: dict[str, str]  # the text fields read, those present

    def text(self, name: str) -> str:
        if name not in self.fields:
            raise invalid(name, "is required")
        return self.fields[name]

    async def chunks(self) -> AsyncIterator[bytes]:
        """The file's bytes as Starlette spooled them (to disk past 1 MiB): never whole in memory."""
        while chunk := await self.file.read(READ_CHUNK):
            yield chunk


async def read_upload(request: Request, fields: FormFields, room: Room | None = None) -> Upload:
    """The form's ``file`` and its text ``fields`` (422 naming one too long); other fields are
    ignored. With a ``room``, a body that outgrows it is refused as it streams in."""
    if not request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
        raise invalid("file", "send a multipart/form-data body with the file")
    stream: AsyncGenerator[bytes, None] = request.stream()
    if room is not None and room.usage.room is not None:
        stream = _within(stream, room.usage, room.usage.room + MULTIPART_SLACK)
    parser = MultiPartParser(request.headers, stream, max_files=1, max_fields=len(fields) + EXTRA_FIELDS)
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        raise AppError(400, f"the multipart body is malformed: {exc.message}") from None
    try:
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise invalid("file", "a file part named 'file' is required")
        values = {name: _text(name, form[name], most) for name, (most, _) in fields.items() if name in form}
    except AppError:
        await form.close()
        raise
    return Upload(upload, values)


def _text(name: str, value: object, most: int) -> str:
    if not isinstance(value, str):
        raise invalid(name, "must be text, not a file")
    if len(value) > most:
        raise invalid(name, f"must be at most {most} characters")
    return value


async def _within(
    stream: AsyncIterator[bytes], found: storage_quota.StorageUsage, most: int
) -> AsyncGenerator[bytes, None]:
    received = 0
    async for chunk in stream:
        received += len(chunk)
        if received > most:
            raise storage_quota.exceeded(found, received - MULTIPART_SLACK, at_least=True)
        yield chunk
