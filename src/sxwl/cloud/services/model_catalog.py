"""The model catalogue: base models (an archive of a hub-style model directory, public when an admin
registered it, else private to its uploader) and the adapters fine-tunes produced (rows the
fine-tune service writes). Archives lie in the store at ``Artifact("models", 0, "<sha256>.tar")``."""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import AsyncIterator, Sequence
from typing import IO

from sqlalchemy import or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.finetune_models import CatalogModel, ModelKind
from sxwl.cloud.db.models import User
from sxwl.cloud.errors import AppError, invalid
from sxwl.cloud.services import storage_quota
from sxwl.cloud.services.model_archive import ArchiveProblem, ModelFacts, inspect
from sxwl.cloud.storage import Artifact, DigestMismatch, StoreUnavailable, TooLarge

MODELS_JOB = "models"  # the store's reserved job id for model archives
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
CHUNK = 1024 * 1024


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise invalid(
            "name",
            "1 to 100 letters, digits, '.', '_' or '-', starting with a letter or digit",
        )
    return name


def artifact_of(model: CatalogModel) -> Artifact:
    """Where the model's tar lies: a base model's archive, or an adapter's job artifact."""
    address = model.object
    return Artifact(job_id=str(address["job_id"]), attempt=int(address["attempt"]), path=str(address["path"]))


def _taken_error(name: str) -> AppError:
    return AppError(409, f"a model named {name} already exists", code="name_taken", details={"name": name})


def _taken(session: Session, name: str) -> AppError | None:
    return None if session.get(CatalogModel, name) is None else _taken_error(name)


def _size_and_sha256(archive: IO[bytes], limit: int) -> tuple[int, str]:
    archive.seek(0)
    digest, size = hashlib.sha256(), 0
    while chunk := archive.read(CHUNK):
        size += len(chunk)
        if size > limit:
            raise AppError(413, f"model archive larger than {limit} bytes", details={"max_bytes": limit})
        digest.update(chunk)
    return size, digest.hexdigest()


async def file_chunks(archive: IO[bytes]) -> AsyncIterator[bytes]:
    """The file's bytes from its start, read off the event loop."""
    await asyncio.to_thread(archive.seek, 0)
    while chunk := await asyncio.to_thread(archive.read, CHUNK):
        yield chunk


async def _register(ctx: CloudContext, owner_id: str | None, name: str, archive: IO[bytes]) -> CatalogModel:
    check_name(name)

    def taken() -> AppError | None:
        with ctx.db.session() as session:
            return _taken(session, name)

    if (conflict := await asyncio.to_thread(taken)) is not None:
        raise conflict
    limit = ctx.settings.model_max_bytes
    # Judged whole before the store sees a byte: a refused archive stores nothing.
    size, digest = await asyncio.to_thread(_size_and_sha256, archive, limit)
    if owner_id is not None:
        await asyncio.to_thread(_fits, ctx, owner_id, size)
    try:
        facts: ModelFacts = await asyncio.to_thread(inspect, archive, max_bytes=limit)
    except ArchiveProblem as exc:
        # Member names are the uploader's bytes: the message stays encodable as JSON.
        raise invalid("file", str(exc).encode("utf-8", "backslashreplace").decode()) from None
    artifact = Artifact(job_id=MODELS_JOB, attempt=0, path=f"{digest}.tar")
    try:
        # The sha256 is checked again on the way in: the file cannot change unnoticed meanwhile.
        await ctx.artifacts.put(artifact, file_chunks(archive), limit, digest)
    except (TooLarge, DigestMismatch):
        raise AppError(409, "the archive changed while it was stored; nothing was recorded") from None
    except StoreUnavailable as exc:
        raise AppError(
            503, f"{exc}; nothing was recorded, try again later", code="store_unavailable"
        ) from None
    row = CatalogModel(
        id=name,
        owner_id=owner_id,
        kind=ModelKind.BASE,
        architecture=facts.architecture,
        parameters=facts.parameters,
        bytes=size,
        sha256=digest,
        object={"job_id": artifact.job_id, "attempt": artifact.attempt, "path": artifact.path},
    )

    def record() -> CatalogModel:
        try:
            with ctx.db.session(immediate=True) as session:
                if owner_id is not None:
                    storage_quota.lock_owner(session, owner_id)
                    storage_quota.require(storage_quota.usage(session, ctx.settings, owner_id), size)
                session.add(row)
        except IntegrityError:
            raise _taken_error(name) from None
        return row

    return await asyncio.to_thread(record)


def _fits(ctx: CloudContext, owner_id: str, size: int) -> None:
    with ctx.db.session() as session:
        storage_quota.require(storage_quota.usage(session, ctx.settings, owner_id), size)


async def upload_base(ctx: CloudContext, *, owner: User, name: str, archive: IO[bytes]) -> CatalogModel:
    """A base model private to ``owner`` from ``archive``, a seekable file (an upload as the web
    server spooled it, a file the CLI opened): 422 naming ``file`` for an archive that is not a model
    directory, 409 for a name taken, 413 past ``model_max_bytes`` or the owner's storage quota."""
    return await _register(ctx, owner.id, name, archive)


async def register_public(ctx: CloudContext, *, name: str, archive: IO[bytes]) -> CatalogModel:
    """A base model every user sees (an admin's, through the API or `sxwl admin register-model`)."""
    return await _register(ctx, None, name, archive)


def visible(session: Session, *, user: User) -> Sequence[CatalogModel]:
    """The public models, the user's own base models and their fine-tunes' adapters."""
    query = select(CatalogModel).where(or_(CatalogModel.owner_id.is_(None), CatalogModel.owner_id == user.id))
    return session.scalars(query.order_by(CatalogModel.created_at, CatalogModel.id)).all()


def get_visible(session: Session, *, user: User, model_id: str) -> CatalogModel:
    model = session.get(CatalogModel, model_id)
    if model is None or (model.owner_id is not None and model.owner_id != user.id):
        raise AppError(404, f"model {model_id} not found")
    return model


def content(session: Session, *, user: User, model_id: str) -> Artifact:
    """Where a model the user may see lies in the store, for ``ArtifactStore.download``."""
    return artifact_of(get_visible(session, user=user, model_id=model_id))
