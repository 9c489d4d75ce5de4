"""Console pages: sign-up, sign-in, account and accessKey, 算力详情, admin user list."""

from __future__ import annotations

import secrets
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError

from sxwl.cloud.api.deps import CSRF_COOKIE, SESSION_COOKIE, Principal, client_ip, console_principal, csrf_ok
from sxwl.cloud.api.schemas import LoginIn, PasswordChangeIn, RegisterIn
from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import Role, SessionKind, User
from sxwl.cloud.errors import AppError
from sxwl.cloud.services import access_keys, accounts, sessions
from sxwl.cloud.web.i18n import DEFAULT_LANGUAGE, LANGUAGES, translate

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=HERE / "templates")
router = APIRouter(include_in_schema=False)

LANG_COOKIE = "sxwl_lang"
NOTICES = {"registered", "logged_out", "password_changed"}
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


templates.env.filters["dt"] = _format_dt


def _ctx(request: Request) -> CloudContext:
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
    return {Role.PROVIDER: "/compute", Role.ADMIN: "/admin/users"}.get(role, "/account")


def safe_next(target: str | None) -> str | None:
    """Only same-site paths, so a crafted link cannot bounce a user to another site after sign-in."""
    if target and target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return None


def signed_in(request: Request) -> Principal | Response:
    principal = console_principal(_ctx(request), request)
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
    principal = console_principal(_ctx(request), request)
    return redirect(home_for(principal.user.role) if principal else "/login")


@router.get("/lang/{code}")
def switch_language(code: str, request: Request, next: str | None = None) -> Response:
    response = redirect(safe_next(next) or "/")
    if code in LANGUAGES:
        response.set_cookie(LANG_COOKIE, code, max_age=365 * 86400, samesite="lax", secure=_secure(request))
    return response


@router.get("/login")
def login_page(request: Request, next: str | None = None) -> Response:
    principal = console_principal(_ctx(request), request)
    if principal:
        return redirect(safe_next(next) or home_for(principal.user.role))
    return render(request, "login.html", next=safe_next(next) or "", form={}, errors={})


@router.post("/login")
async def login_submit(request: Request) -> Response:
    ctx, lang = _ctx(request), language(request)
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
    ctx, lang = _ctx(request), language(request)
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
    ctx = _ctx(request)
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
    ctx = _ctx(request)
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
    ctx, lang = _ctx(request), language(request)
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


@router.get("/compute")
def compute_page(request: Request) -> Response:
    principal = signed_in(request)
    if isinstance(principal, Response):
        return principal
    if principal.user.role != Role.PROVIDER:
        return error_page(request, 403, principal)
    ctx = _ctx(request)
    with ctx.db.session() as session:
        key = access_keys.reveal(ctx, session, principal.user)
    cloud_url = ctx.settings.public_url or str(request.base_url).rstrip("/")
    return render(request, "compute.html", principal, access_key=key, cloud_url=cloud_url)


@router.get("/admin/users")
def admin_users(request: Request, page: int = 1, role: str = "", q: str = "") -> Response:
    principal = signed_in(request)
    if isinstance(principal, Response):
        return principal
    if principal.user.role != Role.ADMIN:
        return error_page(request, 403, principal)
    role_filter = Role(role) if role in {r.value for r in Role} else None
    with _ctx(request).db.session() as session:
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
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    app.state.html_error = error_page
