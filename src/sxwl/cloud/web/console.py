"""Console pages: sign-up, sign-in, account and accessKey, 算力详情 and 可用算力, admin user list.

The job pages (任务) are in ``jobs_pages``, on the helpers of this module."""

from __future__ import annotations

import secrets
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError

from sxwl.cloud.api.deps import (
    CSRF_COOKIE,
    SESSION_COOKIE,
    Principal,
    client_ip,
    console_principal,
    csrf_ok,
    plain_parameters,
)
from sxwl.cloud.api.schemas import CPodRenameIn, LoginIn, PasswordChangeIn, RegisterIn
from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import Role, SessionKind, User
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.errors import AppError
from sxwl.cloud.services import access_keys, accounts, cpods, sessions
from sxwl.cloud.web import compute_view
from sxwl.cloud.web.i18n import DEFAULT_LANGUAGE, LANGUAGES, translate
from sxwl.protocol.fields import CONTROL_CHARS, Int32

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=HERE / "templates")
router = APIRouter(include_in_schema=False)

LANG_COOKIE = "sxwl_lang"
NOTICES = {
    "registered",
    "logged_out",
    "password_changed",
    "cpod_renamed",
    "cpod_revoked",
    "job_submitted",
    "job_cancelled",
    "job_cancel_requested",
}
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
    ),
}
FormErrors = dict[str, str]


def _format_dt(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M UTC") if value else "—"


def _format_dt_seconds(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value else "—"


templates.env.filters["dt"] = _format_dt
templates.env.filters["dt_s"] = _format_dt_seconds
templates.env.globals["gib"] = compute_view.gib


def ctx_of(request: Request) -> CloudContext:
    ctx: CloudContext = request.app.state.ctx
    return ctx


def language(request: Request) -> str:
    lang = request.cookies.get(LANG_COOKIE, DEFAULT_LANGUAGE)
    return lang if lang in LANGUAGES else DEFAULT_LANGUAGE


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


def render(
    request: Request, name: str, principal: Principal | None = None, status: int = 200, **values: Any
) -> HTMLResponse:
    lang = language(request)
    csrf = request.cookies.get(CSRF_COOKIE)
    new_csrf = csrf is None
    csrf = csrf or secrets.token_urlsafe(32)
    notice = request.query_params.get("notice")
    response = templates.TemplateResponse(
        request,
        name,
        {
            "lang": lang,
            "t": lambda key, **kw: translate(lang, key, **kw),
            "user": principal.user if principal else None,
            "csrf_token": csrf,
            "path": request.url.path,
            "notice": notice if notice in NOTICES else None,
            **values,
        },
        status_code=status,
    )
    if new_csrf:
        response.set_cookie(CSRF_COOKIE, csrf, httponly=True, samesite="strict", secure=_secure(request))
    response.headers.update(SECURITY_HEADERS)
    return response


def redirect(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303)


def home_for(role: Role) -> str:
    return {Role.PROVIDER: "/compute", Role.ADMIN: "/admin/users", Role.USER: "/jobs"}.get(role, "/account")


def safe_next(target: str | None) -> str | None:
    """Only same-site paths, so a crafted link cannot bounce a user to another site after sign-in."""
    if target and target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return None


def signed_in(request: Request) -> Principal | Response:
    principal = console_principal(ctx_of(request), request)
    if principal is None:
        return redirect(f"/login?next={quote(request.url.path)}")
    return principal


def field_errors(lang: str, exc: ValidationError | AppError) -> FormErrors:
    """Form-field messages in the console's language for the API's validation errors."""
    if isinstance(exc, AppError):
        items = [(d["field"], d["message"], "") for d in exc.details or []]
    else:
        items = [(".".join(map(str, e["loc"])) or "form", e["msg"], e["type"]) for e in exc.errors()]
    result: FormErrors = {}
    for field, message, kind in items:
        if kind == "missing" or (kind == "string_too_short" and "password" not in field):
            key = "error.required"
        elif field == "email":
            key = "error.email_taken" if "already" in message else "error.email_invalid"
        elif "password" in field and "incorrect" in message:
            key = "error.current_password"
        elif "password" in field and kind in ("string_too_short", ""):
            key = "error.password_short"
        elif field == "phone":
            key = "error.phone_invalid"
        elif kind == "string_too_long":
            key = "error.too_long"
        elif CONTROL_CHARS in message:
            key = "error.control_chars"
        else:
            result.setdefault(field, message)
            continue
        result.setdefault(field, translate(lang, key))
    return result


def rate_limit_message(lang: str, exc: AppError) -> str:
    return translate(lang, "error.rate_limited", seconds=(exc.details or {}).get("retry_after_s", 60))


def start_console_session(request: Request, ctx: CloudContext, response: Response, user_id: str) -> None:
    with ctx.db.session() as session:
        user = session.get_one(User, user_id)
        token = sessions.start(session, user, SessionKind.CONSOLE, ctx.settings.session_ttl_s)
    response.set_cookie(
        SESSION_COOKIE,
        token,
        max_age=ctx.settings.session_ttl_s,
        httponly=True,
        samesite="lax",
        secure=_secure(request),
    )


@router.get("/")
def index(request: Request) -> Response:
    principal = console_principal(ctx_of(request), request)
    return redirect(home_for(principal.user.role) if principal else "/login")


@router.get("/lang/{code}")
def switch_language(code: str, request: Request, next: str | None = None) -> Response:
    response = redirect(safe_next(next) or "/")
    if code in LANGUAGES:
        response.set_cookie(LANG_COOKIE, code, max_age=365 * 86400, samesite="lax", secure=_secure(request))
    return response


@router.get("/login")
def login_page(request: Request, next: str | None = None) -> Response:
    principal = console_principal(ctx_of(request), request)
    if principal:
        return redirect(safe_next(next) or home_for(principal.user.role))
    return render(request, "login.html", next=safe_next(next) or "", form={}, errors={})


@router.post("/login")
async def login_submit(request: Request) -> Response:
    ctx, lang = ctx_of(request), language(request)
    form = {k: str(v) for k, v in (await request.form()).items()}
    target = safe_next(form.get("next"))
    values: dict[str, Any] = {"next": target or "", "form": {"email": form.get("email", "")}}
    if not csrf_ok(request, form.get("csrf_token")):
        return render(
            request, "login.html", status=403, errors={"form": translate(lang, "error.csrf")}, **values
        )
    try:
        body = LoginIn.model_validate({"email": form.get("email", ""), "password": form.get("password", "")})
    except ValidationError as exc:
        return render(request, "login.html", status=422, errors=field_errors(lang, exc), **values)
    try:
        user = accounts.sign_in(ctx, client_ip(request), body.email, body.password)
    except AppError as exc:
        message = (
            rate_limit_message(lang, exc) if exc.status == 429 else translate(lang, "error.bad_credentials")
        )
        return render(request, "login.html", status=exc.status, errors={"form": message}, **values)
    response = redirect(target or home_for(user.role))
    start_console_session(request, ctx, response, user.id)
    return response


@router.get("/register")
def register_page(request: Request, role: str = "provider") -> Response:
    role = role if role in ("provider", "user") else "provider"
    return render(request, "register.html", form={"role": role}, errors={})


@router.post("/register")
async def register_submit(request: Request) -> Response:
    ctx, lang = ctx_of(request), language(request)
    form = {k: str(v) for k, v in (await request.form()).items()}
    role = form.get("role") if form.get("role") in ("provider", "user") else "provider"
    shown = {k: form.get(k, "") for k in ("email", "name", "company", "phone")} | {"role": role}
    if not csrf_ok(request, form.get("csrf_token")):
        return render(
            request, "register.html", status=403, form=shown, errors={"form": translate(lang, "error.csrf")}
        )
    fields = {k: form.get(k, "") for k in ("email", "password", "name", "company", "phone")}
    try:
        body = RegisterIn.model_validate(fields | {"role": role})
    except ValidationError as exc:
        return render(request, "register.html", status=422, form=shown, errors=field_errors(lang, exc))
    try:
        new = accounts.NewAccount(
            body.email, body.password, Role(body.role), body.name, body.company, body.phone
        )
        user = accounts.register(ctx, client_ip(request), new)
    except AppError as exc:
        errors = {"form": rate_limit_message(lang, exc)} if exc.status == 429 else field_errors(lang, exc)
        return render(request, "register.html", status=exc.status, form=shown, errors=errors)
    response = redirect("/account?notice=registered")
    start_console_session(request, ctx, response, user.id)
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    ctx = ctx_of(request)
    form = await request.form()
    principal = console_principal(ctx, request)
    if principal and csrf_ok(request, str(form.get("csrf_token", ""))):
        with ctx.db.session() as session:
            sessions.revoke(session, session.merge(principal.auth))
    response = redirect("/login?notice=logged_out")
    response.delete_cookie(SESSION_COOKIE)
    return response


@router.get("/account")
def account_page(request: Request) -> Response:
    principal = signed_in(request)
    if isinstance(principal, Response):
        return principal
    return _account(request, principal)


def _account(
    request: Request, principal: Principal, status: int = 200, errors: FormErrors | None = None
) -> Response:
    ctx = ctx_of(request)
    history = []
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
    return render(request, "account.html", principal, status=status, key_history=history, errors=errors or {})


@router.post("/account/password")
async def change_password(request: Request) -> Response:
    principal = signed_in(request)
    if isinstance(principal, Response):
        return principal
    ctx, lang = ctx_of(request), language(request)
    form = {k: str(v) for k, v in (await request.form()).items()}
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


# ---- 算力详情 (providers and admins) and 可用算力 (everyone signed in) ---------------------------

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
        "event_detail": lambda kind, detail: compute_view.event_detail(lang, kind, detail),
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
    key = None
    if principal.user.role == Role.PROVIDER:
        with ctx.db.session() as session:
            key = access_keys.reveal(ctx, session, principal.user)
    cloud_url = ctx.settings.public_url or str(request.base_url).rstrip("/")
    return render(
        request,
        "compute.html",
        principal,
        status=status,
        path="/compute",  # also after a form post, so the nav and the language link point at the page
        access_key=key,
        cloud_url=cloud_url,
        ago_formats=compute_view.ago_formats(language(request)),
        errors=errors or {},
        **(values | {"rename_error": rename_error}),
    )


def _compute_principal(request: Request) -> Principal | Response:
    """Providers (their own CPods) and admins (every CPod); compute users get 403."""
    principal = signed_in(request)
    if isinstance(principal, Response):
        return principal
    if principal.user.role not in (Role.PROVIDER, Role.ADMIN):
        return error_page(request, 403, principal)
    return principal


@router.get("/compute")
def compute_page(request: Request) -> Response:
    principal = _compute_principal(request)
    if isinstance(principal, Response):
        return principal
    return _compute(request, principal)


@router.get("/compute/fragment")
def compute_fragment(request: Request) -> Response:
    """The live part of 算力详情 alone, for app.js to swap in every few seconds."""
    principal = console_principal(ctx_of(request), request)
    if principal is None:
        return signed_out_fragment()
    if principal.user.role not in (Role.PROVIDER, Role.ADMIN):
        return error_page(request, 403, principal)
    return render(request, "_compute_live.html", principal, **_compute_values(request, principal))


def signed_out_fragment() -> Response:
    # Not a redirect: fetch() would follow it and swap the login page in. app.js reloads instead.
    return PlainTextResponse("sign in required", status_code=401, headers=SECURITY_HEADERS)


async def _cpod_form(request: Request, cpod_id: str) -> tuple[Principal, dict[str, str]] | Response:
    """The signed-in provider or admin posting a form about a CPod they may change, CSRF checked."""
    principal = _compute_principal(request)
    if isinstance(principal, Response):
        return principal
    form = {k: str(v) for k, v in (await request.form()).items()}
    if not csrf_ok(request, form.get("csrf_token")):
        return _compute(request, principal, 403, {"form": translate(language(request), "error.csrf")})
    try:
        with ctx_of(request).db.session() as session:
            cpods.get_for(session, principal.user, cpod_id)
    except AppError as exc:
        return error_page(request, exc.status, principal)
    return principal, form


@router.post("/compute/cpods/{cpod_id}/rename")
async def rename_cpod(cpod_id: str, request: Request) -> Response:
    checked = await _cpod_form(request, cpod_id)
    if isinstance(checked, Response):
        return checked
    principal, form = checked
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
async def revoke_cpod(cpod_id: str, request: Request) -> Response:
    checked = await _cpod_form(request, cpod_id)
    if isinstance(checked, Response):
        return checked
    principal, _ = checked
    try:
        with ctx_of(request).db.session() as session:
            cpods.revoke(ctx_of(request), session, principal.user, cpod_id)
    except AppError as exc:
        return error_page(request, exc.status, principal)
    return redirect(f"/compute?notice=cpod_revoked#cpod-{cpod_id}")


def _gpus_values(request: Request) -> dict[str, Any]:
    with ctx_of(request).db.session() as session:
        return {"gpu_types": cpods.gpu_types(session)}


@router.get("/gpus")
def gpus_page(request: Request) -> Response:
    """可用算力: free GPUs per product over every online CPod; no CPod or provider is named."""
    principal = signed_in(request)
    if isinstance(principal, Response):
        return principal
    return render(request, "gpus.html", principal, **_gpus_values(request))


@router.get("/gpus/fragment")
def gpus_fragment(request: Request) -> Response:
    principal = console_principal(ctx_of(request), request)
    if principal is None:
        return signed_out_fragment()
    return render(request, "_gpus_live.html", principal, **_gpus_values(request))


@router.get("/admin/users")
def admin_users(request: Request, page: Int32 = 1, role: str = "", q: str = "") -> Response:
    principal = signed_in(request)
    if isinstance(principal, Response):
        return principal
    if principal.user.role != Role.ADMIN:
        return error_page(request, 403, principal)
    role_filter = Role(role) if role in {r.value for r in Role} else None
    with ctx_of(request).db.session() as session:
        result = accounts.list_users(session, max(page, 1), 25, role_filter, q[:320])
    return render(
        request,
        "admin_users.html",
        principal,
        result=result,
        role=role_filter.value if role_filter else "",
        q=q,
        roles=[r.value for r in Role],
    )


def error_page(request: Request, status: int, principal: Principal | None = None) -> Response:
    lang = language(request)
    message = (
        translate(lang, f"error.{status}") if status in (401, 403, 404) else translate(lang, "error.title")
    )
    return render(request, "error.html", principal, status=status, status_code=status, message=message)


def install(app: FastAPI) -> None:
    from sxwl.cloud.web import jobs_pages  # imports this module: not at the top

    checked = [Depends(plain_parameters)]
    app.include_router(router, dependencies=checked)
    app.include_router(jobs_pages.router, dependencies=checked)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    app.state.html_error = error_page
