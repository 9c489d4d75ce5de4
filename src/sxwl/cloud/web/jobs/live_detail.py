"""What a job's page and a fine-tune's page share: the whole page and its live fragment made from
the same values, the banner of what a form just did (shown while the state it spoke of lasts:
app.js removes it when the state changes and drops its query from the address), and the cancel form
(CSRF, then any refusal said in place, above the page). ``add_routes`` serves the three at a
kind's path, for compute users and admins (providers run neither)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from sqlalchemy.orm import Session

from sxwl.cloud.api.deps import Principal, csrf_ok
from sxwl.cloud.db.models import User
from sxwl.cloud.errors import AppError
from sxwl.cloud.web.i18n import translate
from sxwl.cloud.web.kit import (
    JobsFragmentViewer,
    JobsViewer,
    ctx_of,
    error_page,
    language,
    redirect,
    render,
)

Values = dict[str, Any]


@dataclass(frozen=True)
class DetailKind:
    """One kind of detail page. ``values`` reads what both the page and its fragment show (an
    AppError when the caller may not see it); it has ``d`` (with ``terminal``), ``title`` and
    ``live_state`` (what the page's banner speaks of)."""

    path: str  # "/jobs": the page is path/{id}, its fragment path/{id}/fragment
    fragment: str  # the template of the live part
    live_id: str  # the element app.js refreshes
    banner_id: str
    back: str  # the breadcrumb's text key, back to `path`
    values: Callable[[Request, Principal, str], Values]
    # What cancelling does (the user's, the item's id): the query of the page to show after it.
    cancel: Callable[[Session, User, str], str]
    # The banner for the page's query (a form's redirect), in the language, or None.
    banner: Callable[[str, Request, Values], str | None]
    # The sentence for a cancel refused because the item has finished.
    finished: Callable[[str, Values], str]
    # How often the page fetches its live fragment, in milliseconds (a job's log has its own, faster
    # poll); a finished item changes little more: look rarely.
    refresh_ms: int = 3000
    finished_refresh_ms: int = 30_000


def _values(kind: DetailKind, request: Request, principal: Principal, item_id: str) -> Values | AppError:
    try:
        return kind.values(request, principal, item_id)
    except AppError as exc:
        return exc


def page(
    kind: DetailKind,
    request: Request,
    principal: Principal,
    item_id: str,
    status: int = 200,
    alert: str | None = None,
    conflict: bool = False,
) -> Response:
    values = _values(kind, request, principal, item_id)
    if isinstance(values, AppError):
        return error_page(request, values.status, principal)
    return render(
        request,
        "live_detail.html",
        principal,
        status=status,
        path=f"{kind.path}/{item_id}",
        kind=kind,
        fragment_src=f"{kind.path}/{item_id}/fragment",
        banner=None if alert else kind.banner(language(request), request, values),
        alert=alert,
        conflict=conflict,
        refresh_ms=kind.finished_refresh_ms if values["d"].terminal else kind.refresh_ms,
        **values,
    )


def fragment(kind: DetailKind, request: Request, principal: Principal, item_id: str) -> Response:
    values = _values(kind, request, principal, item_id)
    if isinstance(values, AppError):
        return error_page(request, values.status, principal)
    return render(request, kind.fragment, principal, **values)


async def cancel(kind: DetailKind, request: Request, principal: Principal, item_id: str) -> Response:
    ctx, lang = ctx_of(request), language(request)
    form = await request.form()
    if not csrf_ok(request, str(form.get("csrf_token", ""))):
        return page(kind, request, principal, item_id, 403, translate(lang, "error.csrf"))
    try:
        with ctx.db.session() as session:
            query = kind.cancel(session, session.merge(principal.user), item_id)
    except AppError as exc:
        if exc.status >= 500:
            return error_page(request, exc.status, principal)
        if exc.status == 409:  # finished meanwhile: said in words, with the state it ended in
            values = _values(kind, request, principal, item_id)
            if not isinstance(values, AppError):
                return page(kind, request, principal, item_id, 409, kind.finished(lang, values), True)
        return page(kind, request, principal, item_id, exc.status, exc.message)
    return redirect(f"{kind.path}/{item_id}?{query}")


def add_routes(router: APIRouter, kind: DetailKind) -> None:
    """``GET path/{id}``, ``GET path/{id}/fragment`` and ``POST path/{id}/cancel``. Added after the
    router's fixed paths (``path/new`` ...), which would otherwise be read as ids."""

    def detail_page(item_id: str, request: Request, principal: JobsViewer) -> Response:
        return page(kind, request, principal, item_id)

    def detail_fragment(item_id: str, request: Request, principal: JobsFragmentViewer) -> Response:
        return fragment(kind, request, principal, item_id)

    async def detail_cancel(item_id: str, request: Request, principal: JobsViewer) -> Response:
        return await cancel(kind, request, principal, item_id)

    router.add_api_route(f"{kind.path}/{{item_id}}", detail_page, methods=["GET"])
    router.add_api_route(f"{kind.path}/{{item_id}}/fragment", detail_fragment, methods=["GET"])
    router.add_api_route(f"{kind.path}/{{item_id}}/cancel", detail_cancel, methods=["POST"])


# How often a list page fetches its live fragment, in milliseconds.
LIST_REFRESH_MS = 5000


def list_page(
    request: Request, principal: Principal, template: str, fragment_path: str, values: dict[str, Any]
) -> Response:
    """A list page (jobs, fine-tunes) that fetches its live fragment, with the page's own query."""
    query = request.url.query
    return render(
        request,
        template,
        principal,
        fragment_src=fragment_path + (f"?{query}" if query else ""),
        refresh_ms=LIST_REFRESH_MS,
        **values,
    )
