"""What every console page is made with: templates and ``render`` (language, CSRF cookie, security
headers), redirects, form-error messages, the error page, and the dependencies that hand a page
handler a signed-in user of the right role, or answer for it (a redirect to sign-in, a 401 for a
live fragment, a 403 page) so that the handler never runs."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from markupsafe import Markup, escape
from pydantic import ValidationError

from sxwl.cloud.api.deps import CSRF_COOKIE, Principal, console_principal
from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import Role
from sxwl.cloud.errors import AppError
from sxwl.cloud.services.money import billing
from sxwl.cloud.web.compute import view as compute_view
from sxwl.cloud.web.i18n import DEFAULT_LANGUAGE, LANGUAGES, translate
from sxwl.cloud.web.money import view as money_view
from sxwl.protocol.fields import CONTROL_CHARS
from sxwl.protocol.money import money_text

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=HERE / "templates")

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
    "price_set",
    "price_removed",
    "topped_up",
    "paid_out",
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


def _email_breaks(value: str | None) -> Markup:
    """An address that a narrow column wraps before its ``@`` and nowhere else (app.css, ``.email``)."""
    local, at, domain = (value or "").rpartition("@")
    if not at:
        return escape(value or "—")
    return Markup('<span class="email">{}</span><wbr><span class="email">@{}</span>').format(local, domain)


templates.env.filters["dt"] = _format_dt
templates.env.filters["email"] = _email_breaks
templates.env.filters["dt_s"] = _format_dt_seconds
# Every amount on every page reads by the one rule (two places, or two significant digits below a
# fen), so a small cost never sits beside a total that rounds it away.
templates.env.filters["yuan"] = money_text
templates.env.globals["gib"] = compute_view.gib


def ctx_of(request: Request) -> CloudContext:
    ctx: CloudContext = request.app.state.ctx
    return ctx


def language(request: Request) -> str:
    lang = request.cookies.get(LANG_COOKIE, DEFAULT_LANGUAGE)
    return lang if lang in LANGUAGES else DEFAULT_LANGUAGE


def secure(request: Request) -> bool:
    return request.url.scheme == "https"


def _balance_warning(request: Request, principal: Principal | None, name: str) -> str | None:
    """The low-balance banner of a compute user's full pages (fragments are swapped into a page that
    already has it)."""
    ctx = ctx_of(request)
    if principal is None or principal.user.role != Role.USER or name.startswith("_"):
        return None
    if not ctx.settings.billing_enabled:
        return None
    with ctx.db.session() as session:
        balance = billing.balance_of(session, principal.user.id)
    return money_view.warning(language(request), balance)


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
            "balance_warning": _balance_warning(request, principal, name),
            "billing_enabled": ctx_of(request).settings.billing_enabled,
            **values,
        },
        status_code=status,
    )
    if new_csrf:
        response.set_cookie(CSRF_COOKIE, csrf, httponly=True, samesite="strict", secure=secure(request))
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


def error_page(request: Request, status: int, principal: Principal | None = None) -> Response:
    lang = language(request)
    message = (
        translate(lang, f"error.{status}") if status in (401, 403, 404) else translate(lang, "error.title")
    )
    return render(request, "error.html", principal, status=status, status_code=status, message=message)


def signed_out_fragment() -> Response:
    # Not a redirect: fetch() would follow it and swap the login page in. app.js reloads instead.
    return PlainTextResponse("sign in required", status_code=401, headers=SECURITY_HEADERS)


async def read_form(request: Request) -> dict[str, str]:
    return {k: str(v) for k, v in (await request.form()).items()}


# ---- who may see a page ------------------------------------------------------------------------


class PageRefused(Exception):
    """Raised by a page's dependency: the handler does not run and ``response`` is the answer."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status_code)
        self.response = response


def page_refused(_request: Request, exc: Exception) -> Response:
    """The application's handler for ``PageRefused``."""
    assert isinstance(exc, PageRefused)
    return exc.response


def _guard(roles: frozenset[Role] | None, *, fragment: bool) -> Callable[[Request], Principal]:
    """A dependency: the signed-in principal when their role is in ``roles`` (any role when None).
    Signed out, a page redirects to sign-in and comes back; a live fragment answers 401."""

    def principal_of(request: Request) -> Principal:
        principal = console_principal(ctx_of(request), request)
        if principal is None:
            raise PageRefused(
                signed_out_fragment() if fragment else redirect(f"/login?next={quote(request.url.path)}")
            )
        if roles is not None and principal.user.role not in roles:
            raise PageRefused(error_page(request, 403, principal))
        return principal

    return principal_of


_COMPUTE_ROLES = frozenset({Role.PROVIDER, Role.ADMIN})  # their own CPods; an admin's are all CPods
_JOB_ROLES = frozenset({Role.USER, Role.ADMIN})  # providers run no jobs

SignedIn = Annotated[Principal, Depends(_guard(None, fragment=False))]
SignedInFragment = Annotated[Principal, Depends(_guard(None, fragment=True))]
ComputeViewer = Annotated[Principal, Depends(_guard(_COMPUTE_ROLES, fragment=False))]
ComputeFragmentViewer = Annotated[Principal, Depends(_guard(_COMPUTE_ROLES, fragment=True))]
JobsViewer = Annotated[Principal, Depends(_guard(_JOB_ROLES, fragment=False))]
JobsFragmentViewer = Annotated[Principal, Depends(_guard(_JOB_ROLES, fragment=True))]
Admin = Annotated[Principal, Depends(_guard(frozenset({Role.ADMIN}), fragment=False))]
