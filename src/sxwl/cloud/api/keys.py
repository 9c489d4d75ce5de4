"""Inference keys (docs/endpoints.md, "Keys"): create one (its secret shown in this answer only),
list, change its limits, revoke."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from sxwl.cloud.api.deps import Ctx, CurrentUser
from sxwl.cloud.api.responses import SIGNED_IN, WITH_BODY, errors
from sxwl.cloud.db.endpoint_models import InferenceKey
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services.endpoints import inference_keys, key_limits
from sxwl.protocol.endpoints import KeyLimits
from sxwl.protocol.fields import Name
from sxwl.protocol.money import yuan

router = APIRouter(prefix="/keys", tags=["keys"], responses=SIGNED_IN)


class KeyIn(KeyLimits):
    name: Name = Field(default="key", min_length=1, max_length=100)


class KeyOut(BaseModel):
    id: str
    name: str
    prefix: str = Field(description="the secret's first characters, to tell keys apart")
    rpm: int | None
    tpm: int | None
    monthly_cap: int | None = Field(description="micro-yuan")
    monthly_cap_yuan: str | None
    spent_this_month: int = Field(description="micro-yuan: its share of its endpoints' cost this UTC month")
    spent_this_month_yuan: str
    created_at: datetime
    revoked_at: datetime | None


class CreatedKeyOut(KeyOut):
    key: str = Field(description="the secret (sk-…): shown in this answer only")


def _out(session: Session, key: InferenceKey) -> KeyOut:
    spent = key_limits.spent_this_month(session, key, utcnow()) if key.revoked_at is None else 0
    cap = key.monthly_cap
    return KeyOut(
        id=key.id,
        name=key.name,
        prefix=key.prefix,
        rpm=key.rpm,
        tpm=key.tpm,
        monthly_cap=cap,
        monthly_cap_yuan=None if cap is None else str(yuan(cap)),
        spent_this_month=spent,
        spent_this_month_yuan=str(yuan(spent)),
        created_at=key.created_at,
        revoked_at=key.revoked_at,
    )


def _limits(body: KeyLimits) -> inference_keys.Limits:
    return inference_keys.Limits(rpm=body.rpm, tpm=body.tpm, monthly_cap=body.monthly_cap)


@router.post("", status_code=201, response_model=CreatedKeyOut, responses=WITH_BODY | errors(409))
def create(body: KeyIn, user: CurrentUser, ctx: Ctx) -> CreatedKeyOut:
    with ctx.db.session() as session:
        made = inference_keys.create(session, user, body.name, _limits(body))
        return CreatedKeyOut(**_out(session, made.key).model_dump(), key=made.secret)


@router.get("", response_model=list[KeyOut])
def list_keys(user: CurrentUser, ctx: Ctx) -> list[KeyOut]:
    with ctx.db.session() as session:
        return [_out(session, k) for k in inference_keys.list_for(session, user)]


@router.patch("/{key_id}", response_model=KeyOut, responses=WITH_BODY | errors(404, 409))
def change(key_id: str, body: KeyLimits, user: CurrentUser, ctx: Ctx) -> KeyOut:
    """Sets the limits the body names (null lifts one); the others stay as they are."""
    changes = {field: getattr(body, field) for field in body.model_fields_set}
    with ctx.db.session() as session:
        return _out(session, inference_keys.change(session, user, key_id, changes))


@router.delete("/{key_id}", response_model=KeyOut, responses=errors(404))
def revoke(key_id: str, user: CurrentUser, ctx: Ctx) -> KeyOut:
    with ctx.db.session() as session:
        return _out(session, inference_keys.revoke(session, user, key_id))
