"""Sign-up, sign-in, sign-out and the language switch."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError

from sxwl.cloud.api.deps import SESSION_COOKIE, client_ip, console_principal, csrf_ok
from sxwl.cloud.api.schemas import LoginIn, RegisterIn
from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import Role, SessionKind, User
from sxwl.cloud.errors import AppError
from sxwl.cloud.services.accounts import accounts, sessions
from sxwl.cloud.web.i18n import LANGUAGES, translate
from sxwl.cloud.web.kit import (
    LANG_COOKIE,
    ctx_of,
    field_errors,
    home_for,
    language,
    rate_limit_message,
    read_form,
    redirect,
    render,
    safe_next,
    secure,
)

router = APIRouter(include_in_schema=False)


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
        secure=secure(request),
    )
    response.headers["Cache-Control"] = "no-store"  # it carries the session's token


@router.get("/")
def index(request: Request) -> Response:
    principal = console_principal(ctx_of(request), request)
    return redirect(home_for(principal.user.role) if principal else "/login")


@router.get("/lang/{code}")
def switch_language(code: str, request: Request, next: str | None = None) -> Response:
    response = redirect(safe_next(next) or "/")
    if code in LANGUAGES:
        response.set_cookie(LANG_COOKIE, code, max_age=365 * 86400, samesite="lax", secure=secure(request))
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
    form = await read_form(request)
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
        user = await accounts.sign_in(ctx, client_ip(request), body.email, body.password)
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
    form = await read_form(request)
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
    """Revokes the session in the database; without the CSRF token changes nothing (403)."""
    ctx = ctx_of(request)
    form = await request.form()
    principal = console_principal(ctx, request)
    if principal:
        if not csrf_ok(request, str(form.get("csrf_token", ""))):
            message = translate(language(request), "error.csrf")
            return render(request, "error.html", principal, status=403, status_code=403, message=message)
        with ctx.db.session() as session:
            sessions.revoke(session, session.merge(principal.auth))
    response = redirect("/login?notice=logged_out")
    response.delete_cookie(SESSION_COOKIE)
    return response
