"""The signed-in account: details, storage used against the quota, password, and a provider's
accessKey."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response

from sxwl.cloud.api.deps import Ctx, CurrentUser
from sxwl.cloud.api.responses import SIGNED_IN, WITH_BODY, no_store
from sxwl.cloud.api.schemas import AccessKeyOut, AccessKeyRecordOut, PasswordChangeIn, StorageOut, UserOut
from sxwl.cloud.services.accounts import access_keys, accounts
from sxwl.cloud.services.catalog import storage_quota

router = APIRouter(prefix="/me", tags=["account"], responses=SIGNED_IN)


@router.get("", response_model=UserOut)
def me(user: CurrentUser) -> UserOut:
    return UserOut.model_validate(user)


@router.get("/storage", response_model=StorageOut)
def storage(user: CurrentUser, ctx: Ctx) -> StorageOut:
    """The bytes the caller's files, base models and job artifacts take, against their quota."""
    with ctx.db.session() as session:
        found = storage_quota.usage(session, ctx.settings, user.id)
    return StorageOut(
        used_bytes=found.used,
        limit_bytes=found.quota or None,
        available_bytes=found.room,
        files_bytes=found.files,
        models_bytes=found.models,
        artifacts_bytes=found.artifacts,
    )


@router.post("/password", status_code=204, responses=WITH_BODY)
def change_password(body: PasswordChangeIn, user: CurrentUser, ctx: Ctx) -> Response:
    """Changes the password and ends every session of this account, this one included."""
    with ctx.db.session() as session:
        accounts.change_password(ctx, session, session.merge(user), body.current_password, body.new_password)
    return Response(status_code=204)


@router.get("/access-key", response_model=AccessKeyOut, dependencies=[Depends(no_store)])
def get_access_key(user: CurrentUser, ctx: Ctx) -> AccessKeyOut:
    with ctx.db.session() as session:
        key = access_keys.reveal(ctx, session, user)
        current = access_keys.active(session, user)
        assert current is not None
        return AccessKeyOut(access_key=key, created_at=current.created_at)


@router.post("/access-key/rotate", response_model=AccessKeyOut, dependencies=[Depends(no_store)])
def rotate_access_key(user: CurrentUser, ctx: Ctx) -> AccessKeyOut:
    """Issues a new accessKey; the old one stops working immediately."""
    with ctx.db.session() as session:
        key = access_keys.rotate(ctx, session, session.merge(user), actor=user)
        current = access_keys.active(session, user)
        assert current is not None
        return AccessKeyOut(access_key=key, created_at=current.created_at)


@router.get("/access-key/history", response_model=list[AccessKeyRecordOut])
def access_key_history(user: CurrentUser, ctx: Ctx) -> list[AccessKeyRecordOut]:
    with ctx.db.session() as session:
        return [
            AccessKeyRecordOut(
                hint=record.hint,
                created_at=record.created_at,
                created_by=record.created_by.email if record.created_by else None,
                revoked_at=record.revoked_at,
                revoked_by=record.revoked_by.email if record.revoked_by else None,
            )
            for record in access_keys.history(session, user)
        ]
