"""算力详情 (providers see their CPods, admins every CPod: status, nodes, GPUs, events, rename,
revoke) and 可用算力 (free GPUs per product, for everyone signed in)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError

from sxwl.cloud.api.deps import Principal, csrf_ok
from sxwl.cloud.api.schemas import CPodRenameIn
from sxwl.cloud.db.models import Role
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.errors import AppError
from sxwl.cloud.services.accounts import access_keys
from sxwl.cloud.services.fleet import cpods
from sxwl.cloud.services.money import billing, earnings
from sxwl.cloud.web.compute import view as compute_view
from sxwl.cloud.web.i18n import translate
from sxwl.cloud.web.kit import (
    ComputeFragmentViewer,
    ComputeViewer,
    FormErrors,
    PageRefused,
    SignedIn,
    SignedInFragment,
    ctx_of,
    error_page,
    language,
    read_form,
    redirect,
    render,
)
from sxwl.cloud.web.money import view as money_view

router = APIRouter(include_in_schema=False)

# (CPod id, message, the name as typed) of a rename that failed, shown in place on that CPod's card.
RenameError = tuple[str, str, str]
NO_RENAME_ERROR: RenameError = ("", "", "")


def _compute_values(request: Request, principal: Principal) -> dict[str, Any]:
    """What the live part of 算力详情 shows, for the page and for its fragment."""
    lang = language(request)
    with ctx_of(request).db.session() as session:
        views = compute_view.cpod_views(session, principal.user, utcnow())
    return {
        "views": views,
        "totals": compute_view.online_totals(views),
        "counts": compute_view.status_counts(views),
        "is_admin": principal.user.role == Role.ADMIN,
        "ago": lambda seconds: compute_view.ago(lang, seconds),
        "event_name": lambda kind: compute_view.event_name(lang, kind),
        "event_detail": lambda kind, detail: compute_view.event_detail(lang, detail),
        "rename_error": NO_RENAME_ERROR,
    }


def _compute(
    request: Request,
    principal: Principal,
    status: int = 200,
    errors: FormErrors | None = None,
    rename_error: RenameError = NO_RENAME_ERROR,
) -> Response:
    ctx = ctx_of(request)
    values = _compute_values(request, principal)
    key, earned = None, None
    if principal.user.role == Role.PROVIDER:
        with ctx.db.session() as session:
            key = access_keys.reveal(ctx, session, principal.user)
            if ctx.settings.billing_enabled:
                now = utcnow()
                start, end = billing.month_bounds(now.strftime("%Y-%m"))
                earned = earnings.earnings_of(session, principal.user.id, start, end, now)
    cloud_url = ctx.settings.public_url or str(request.base_url).rstrip("/")
    return render(
        request,
        "compute.html",
        principal,
        status=status,
        path="/compute",  # also after a form post, so the nav and the language link point at the page
        access_key=key,
        e=earned,
        hold_days=money_view.hold_days(ctx.settings.earnings_hold_s),
        cloud_url=cloud_url,
        artifact_served=ctx.settings.artifact_served,
        # The served artifact names the cloud only where its operator set the public URL.
        artifact_names_cloud=ctx.settings.artifact_served and bool(ctx.settings.public_url),
        ago_formats=compute_view.ago_formats(language(request)),
        errors=errors or {},
        **(values | {"rename_error": rename_error}),
    )


@router.get("/compute")
def compute_page(request: Request, principal: ComputeViewer) -> Response:
    return _compute(request, principal)


@router.get("/compute/fragment")
def compute_fragment(request: Request, principal: ComputeFragmentViewer) -> Response:
    """The live part of 算力详情 alone, for app.js to swap in every few seconds."""
    return render(request, "_compute_live.html", principal, **_compute_values(request, principal))


async def _cpod_form(request: Request, principal: Principal, cpod_id: str) -> dict[str, str]:
    """The form a provider or admin posts about a CPod, once CSRF is checked and the CPod is theirs
    to change; otherwise the page to answer with is raised."""
    form = await read_form(request)
    if not csrf_ok(request, form.get("csrf_token")):
        raise PageRefused(
            _compute(request, principal, 403, {"form": translate(language(request), "error.csrf")})
        )
    try:
        with ctx_of(request).db.session() as session:
            cpods.get_for(session, principal.user, cpod_id)
    except AppError as exc:
        raise PageRefused(error_page(request, exc.status, principal)) from None
    return form


@router.post("/compute/cpods/{cpod_id}/rename")
async def rename_cpod(cpod_id: str, request: Request, principal: ComputeViewer) -> Response:
    form = await _cpod_form(request, principal, cpod_id)
    typed = form.get("name", "")
    try:
        body = CPodRenameIn.model_validate({"name": typed})
    except ValidationError as exc:
        kinds = {e["type"] for e in exc.errors()}
        key = (
            "error.cpod_name_long"
            if "string_too_long" in kinds
            else "error.control_chars"
            if "value_error" in kinds  # the name's only value check: control characters
            else "error.required"
        )
        message = translate(language(request), key)
        return _compute(request, principal, 422, rename_error=(cpod_id, message, typed))
    try:
        with ctx_of(request).db.session() as session:
            cpods.rename(session, principal.user, cpod_id, body.name)
    except AppError as exc:
        return error_page(request, exc.status, principal)
    return redirect(f"/compute?notice=cpod_renamed#cpod-{cpod_id}")


@router.post("/compute/cpods/{cpod_id}/revoke")
async def revoke_cpod(cpod_id: str, request: Request, principal: ComputeViewer) -> Response:
    await _cpod_form(request, principal, cpod_id)
    try:
        with ctx_of(request).db.session() as session:
            cpods.revoke(session, principal.user, cpod_id)
    except AppError as exc:
        return error_page(request, exc.status, principal)
    return redirect(f"/compute?notice=cpod_revoked#cpod-{cpod_id}")


def _gpus_values(request: Request) -> dict[str, Any]:
    with ctx_of(request).db.session() as session:
        return {"gpu_types": cpods.gpu_types(session)}


@router.get("/gpus")
def gpus_page(request: Request, principal: SignedIn) -> Response:
    """可用算力: free GPUs per product over every online CPod; no CPod or provider is named."""
    return render(request, "gpus.html", principal, **_gpus_values(request))


@router.get("/gpus/fragment")
def gpus_fragment(request: Request, principal: SignedInFragment) -> Response:
    return render(request, "_gpus_live.html", principal, **_gpus_values(request))
