"""The model catalogue: base models (an archive of a hub-style model directory, public when an admin
registered it, else private to its uploader) and the adapters fine-tunes produced (rows the
fine-tune service writes). Archives lie in the store at ``Artifact("models", 0, "<sha256>.tar")``.

Names are per owner (docs/finetune.md, "Models"): a user names a model anything but a public
model's name or one of their own; an admin names a public model anything but another public one's.
Where a user's name is also a public one's (an admin registered it later), that name means the
user's own model to that user, and the public one to everyone else."""

from __future__ import annotations

import asyncio
import hashlib
import re
import secrets
from collections.abc import AsyncIterator, Sequence
from typing import IO

from sqlalchemy import or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.finetune_models import CatalogModel, ModelKind
from sxwl.cloud.db.models import User
from sxwl.cloud.errors import AppError, invalid
from sxwl.cloud.services.catalog import storage_quota
from sxwl.cloud.services.catalog.model_archive import ArchiveProblem, ModelFacts, inspect
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
    return Artifact(job_id=address["job_id"], attempt=address["attempt"], path=address["path"])


def _taken_error(name: str) -> AppError:
    return AppError(409, f"a model named {name} already exists", code="name_taken", details={"name": name})


def _namesakes(session: Session, owner_id: str | None, name: str) -> Sequence[CatalogModel]:
    """The models named ``name`` that ``owner_id`` sees: the public ones, and its own."""
    public = CatalogModel.owner_id.is_(None)
    scope = public if owner_id is None else or_(public, CatalogModel.owner_id == owner_id)
    return session.scalars(select(CatalogModel).where(CatalogModel.name == name, scope)).all()


def _taken(session: Session, owner_id: str | None, name: str) -> AppError | None:
    """A public name is taken for everyone (every user sees it), a private one for its owner only."""
    return _taken_error(name) if _namesakes(session, owner_id, name) else None


def find(session: Session, user: User, name: str) -> CatalogModel | None:
    """The model ``name`` means to ``user``: their own, else the public one."""
    found = _namesakes(session, user.id, name)
    return next((m for m in found if m.owner_id is not None), found[0] if found else None)


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
            return _taken(session, owner_id, name)

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
    # Again, now that the judging (minutes for a big model) is done: a name taken meanwhile
    # stores nothing either.
    if (conflict := await asyncio.to_thread(taken)) is not None:
        raise conflict
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
        id=f"model-{secrets.token_hex(12)}",
        name=name,
        owner_id=owner_id,
        kind=ModelKind.BASE,
        base=None,
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
    directory, 409 for a name the owner already gave or a public model has, 413 past
    ``model_max_bytes`` or the owner's storage quota."""
    return await _register(ctx, owner.id, name, archive)


async def register_public(ctx: CloudContext, *, name: str, archive: IO[bytes]) -> CatalogModel:
    """A base model every user sees (an admin's, through the API or `sxwl admin register-model`)."""
    return await _register(ctx, None, name, archive)


def visible(session: Session, *, user: User) -> list[CatalogModel]:
    """The public models, the user's own base models and their fine-tunes' adapters; a public model
    whose name is also one of the user's is left out (the name means theirs)."""
    query = select(CatalogModel).where(or_(CatalogModel.owner_id.is_(None), CatalogModel.owner_id == user.id))
    found = session.scalars(query.order_by(CatalogModel.created_at, CatalogModel.id)).all()
    own = {m.name for m in found if m.owner_id is not None}
    return [m for m in found if m.owner_id is not None or m.name not in own]


def get_visible(session: Session, *, user: User, model_id: str) -> CatalogModel:
    """The model the user calls ``model_id`` (the API's id is the model's name)."""
    model = find(session, user, model_id)
    if model is None:
        raise AppError(404, f"model {model_id} not found")
    return model


def content(session: Session, *, user: User, model_id: str) -> Artifact:
    """Where a model the user may see lies in the store, for ``ArtifactStore.download``."""
    return artifact_of(get_visible(session, user=user, model_id=model_id))
