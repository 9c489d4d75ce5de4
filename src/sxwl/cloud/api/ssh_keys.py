"""The caller's SSH public keys, which their dev environments' sshd accepts (docs/dev-envs.md)."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Response
from pydantic import BaseModel, Field

from sxwl.cloud.api.deps import Ctx, CurrentUser
from sxwl.cloud.api.responses import SIGNED_IN, WITH_BODY, errors
from sxwl.cloud.db.devenv_models import SshKey
from sxwl.cloud.services.devenvs import ssh_keys
from sxwl.protocol.fields import Name, Strict, Text

router = APIRouter(prefix="/me/ssh-keys", tags=["account"], responses=SIGNED_IN)


class SshKeyIn(Strict):
    name: Name = Field(default="", max_length=100)
    public_key: Text = Field(min_length=1, max_length=16_000)


class SshKeyOut(BaseModel):
    id: str
    name: str
    public_key: str
    fingerprint: str
    created_at: datetime


def _out(key: SshKey) -> SshKeyOut:
    return SshKeyOut(
        id=key.id,
        name=key.name,
        public_key=key.public_key,
        fingerprint=key.fingerprint,
        created_at=key.created_at,
    )


@router.post("", status_code=201, response_model=SshKeyOut, responses=WITH_BODY | errors(409))
def add(body: SshKeyIn, user: CurrentUser, ctx: Ctx) -> SshKeyOut:
    with ctx.db.session() as session:
        return _out(ssh_keys.add(session, user, body.name, body.public_key))


@router.get("", response_model=list[SshKeyOut])
def list_keys(user: CurrentUser, ctx: Ctx) -> list[SshKeyOut]:
    with ctx.db.session() as session:
        return [_out(key) for key in ssh_keys.list_for(session, user)]


@router.delete("/{key_id}", status_code=204, responses=errors(404))
def remove(key_id: str, user: CurrentUser, ctx: Ctx) -> Response:
    with ctx.db.session() as session:
        ssh_keys.remove(session, user, key_id)
    return Response(status_code=204)
