"""The account page: profile, storage used against the quota, password change, and a provider's
accessKey with its history."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError

from sxwl.cloud.api.deps import SESSION_COOKIE, Principal, csrf_ok
from sxwl.cloud.api.schemas import PasswordChangeIn
from sxwl.cloud.db.models import Role
from sxwl.cloud.errors import AppError
from sxwl.cloud.services.accounts import access_keys, accounts
from sxwl.cloud.services.catalog import storage_quota
from sxwl.cloud.web.i18n import translate
from sxwl.cloud.web.jobs import view as jobs_view
from sxwl.cloud.web.kit import (
    FormErrors,
    SignedIn,
    ctx_of,
    field_errors,
    language,
    read_form,
    redirect,
    render,
)

router = APIRouter(include_in_schema=False)


@router.get("/account")
def account_page(request: Request, principal: SignedIn) -> Response:
    return _account(request, principal)


def _account(
    request: Request, principal: Principal, status: int = 200, errors: FormErrors | None = None
) -> Response:
    ctx = ctx_of(request)
    history = []
    storage = None
    if principal.user.role != Role.PROVIDER:
        with ctx.db.session() as session:
            storage = storage_quota.usage(session, ctx.settings, principal.user.id)
    if principal.user.role == Role.PROVIDER:
        with ctx.db.session() as session:
            access_keys.reveal(ctx, session, principal.user)  # creates one if an old account lacks it
            history = [
                {
                    "hint": r.hint,
                    "created_at": r.created_at,
                    "created_by": r.created_by.email if r.created_by else None,
                    "revoked_at": r.revoked_at,
                    "revoked_by": r.revoked_by.email if r.revoked_by else None,
                }
                for r in access_keys.history(session, principal.user)
            ]
    return render(
        request,
        "account.html",
        principal,
        status=status,
        key_history=history,
        artifact_served=ctx.settings.artifact_served,
        # The served artifact names the cloud only where its operator set the public URL.
        artifact_names_cloud=ctx.settings.artifact_served and bool(ctx.settings.public_url),
        cloud_url=ctx.settings.public_url.rstrip("/") or str(request.base_url).rstrip("/"),
        storage=storage,
        size=jobs_view.size,
        errors=errors or {},
    )


@router.post("/account/password")
async def change_password(request: Request, principal: SignedIn) -> Response:
    ctx, lang = ctx_of(request), language(request)
    form = await read_form(request)
    if not csrf_ok(request, form.get("csrf_token")):
        return _account(request, principal, 403, {"form": translate(lang, "error.csrf")})
    try:
        body = PasswordChangeIn.model_validate(
            {
                "current_password": form.get("current_password", ""),
                "new_password": form.get("new_password", ""),
            }
        )
        with ctx.db.session() as session:
            user = session.merge(principal.user)
            accounts.change_password(ctx, session, user, body.current_password, body.new_password)
    except (ValidationError, AppError) as exc:
        return _account(request, principal, 422, field_errors(lang, exc))
    response = redirect("/login?notice=password_changed")
    response.delete_cookie(SESSION_COOKIE)
    return response
