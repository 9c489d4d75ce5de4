"""Administration: the user list and accounts created by an admin."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from sxwl.cloud.api.deps import Ctx, CurrentAdmin
from sxwl.cloud.api.responses import SIGNED_IN, WITH_BODY, errors
from sxwl.cloud.api.schemas import AdminCreateUserIn, UserLimitsIn, UserOut, UserPageOut
from sxwl.cloud.db.models import Role
from sxwl.cloud.services.accounts import accounts
from sxwl.protocol.fields import PosInt32

router = APIRouter(prefix="/admin", tags=["admin"], responses=SIGNED_IN)


@router.get("/users", response_model=UserPageOut)
def list_users(
    admin: CurrentAdmin,
    ctx: Ctx,
    page: Annotated[PosInt32, Query()] = 1,
    per_page: Annotated[int, Query(ge=1, le=200)] = 50,
    role: Literal["provider", "user", "admin"] | None = None,
    q: Annotated[str, Query(max_length=320)] = "",
) -> UserPageOut:
    with ctx.db.session() as session:
        result = accounts.list_users(session, page, per_page, Role(role) if role else None, q)
        return UserPageOut(
            items=[UserOut.model_validate(u) for u in result.items],
            total=result.total,
            page=result.page,
            per_page=result.per_page,
        )


@router.post("/users", status_code=201, response_model=UserOut, responses=WITH_BODY | errors(409))
def create_user(body: AdminCreateUserIn, admin: CurrentAdmin, ctx: Ctx) -> UserOut:
    new = accounts.NewAccount(body.email, body.password, Role(body.role), body.name, body.company, body.phone)
    with ctx.db.session() as session:
        return UserOut.model_validate(accounts.create_user(ctx, session, new, created_by=admin))


@router.patch("/users/{user_id}/limits", response_model=UserOut, responses=WITH_BODY | errors(404))
def set_limits(user_id: str, body: UserLimitsIn, admin: CurrentAdmin, ctx: Ctx) -> UserOut:
    """Caps the GPUs one user's jobs may hold at once (null: the cloud's default)."""
    with ctx.db.session() as session:
        return UserOut.model_validate(accounts.set_max_gpus(session, user_id, body.max_gpus))
