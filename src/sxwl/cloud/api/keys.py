"""Inference keys (docs/endpoints.md, "Keys"): create one (its secret shown in this answer only),
list, revoke."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter
from pydantic import BaseModel, Field

from sxwl.cloud.api.deps import Ctx, CurrentUser
from sxwl.cloud.api.responses import SIGNED_IN, WITH_BODY, errors
from sxwl.cloud.db.endpoint_models import InferenceKey
from sxwl.cloud.services.endpoints import inference_keys
from sxwl.protocol.fields import Name, Strict

router = APIRouter(prefix="/keys", tags=["keys"], responses=SIGNED_IN)


class KeyIn(Strict):
    name: Name = Field(default="key", min_length=1, max_length=100)
    rpm: int | None = Field(
        default=None, ge=1, le=100_000, description="requests per minute, across replicas"
    )


class KeyOut(BaseModel):
    id: str
    name: str
    prefix: str = Field(description="the secret's first characters, to tell keys apart")
    rpm: int | None
    created_at: datetime
    revoked_at: datetime | None


class CreatedKeyOut(KeyOut):
    key: str = Field(description="the secret (sk-…): shown in this answer only")


def _out(key: InferenceKey) -> KeyOut:
    return KeyOut(
        id=key.id,
        name=key.name,
        prefix=key.prefix,
        rpm=key.rpm,
        created_at=key.created_at,
        revoked_at=key.revoked_at,
    )


@router.post("", status_code=201, response_model=CreatedKeyOut, responses=WITH_BODY | errors(409))
def create(body: KeyIn, user: CurrentUser, ctx: Ctx) -> CreatedKeyOut:
    with ctx.db.session() as session:
        made = inference_keys.create(session, user, body.name, body.rpm)
        return CreatedKeyOut(**_out(made.key).model_dump(), key=made.secret)


@router.get("", response_model=list[KeyOut])
def list_keys(user: CurrentUser, ctx: Ctx) -> list[KeyOut]:
    with ctx.db.session() as session:
        return [_out(k) for k in inference_keys.list_for(session, user)]


@router.delete("/{key_id}", response_model=KeyOut, responses=errors(404))
def revoke(key_id: str, user: CurrentUser, ctx: Ctx) -> KeyOut:
    with ctx.db.session() as session:
        return _out(inference_keys.revoke(session, user, key_id))
