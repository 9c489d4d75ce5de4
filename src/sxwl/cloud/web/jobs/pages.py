"""Console pages of jobs (任务): the list, the submit form, one job with its live log, cancel.

Compute users see their own jobs; admins too, and every user's with the list's toggle. Providers
run no jobs and get 403 here. Everything goes through the same services as the REST API."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import Response
from sqlalchemy.orm import Session

from sxwl.cloud.api.deps import Principal, csrf_ok
from sxwl.cloud.db.models import Role, User
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.errors import AppError
from sxwl.cloud.services.fleet import cpods
from sxwl.cloud.services.jobs import jobs as job_service
from sxwl.cloud.services.money import billing
from sxwl.cloud.services.money.prices import price_book
from sxwl.cloud.web.i18n import translate
from sxwl.cloud.web.jobs import live_detail
from sxwl.cloud.web.jobs import view as jobs_view
from sxwl.cloud.web.kit import (
    JobsFragmentViewer,
    JobsViewer,
    ctx_of,
    language,
    redirect,
    render,
)
from sxwl.cloud.web.money import view as money_view
from sxwl.protocol.fields import INT32_MAX
from sxwl.protocol.jobs import MAX_GPUS_PER_NODE, MAX_NODES

router = APIRouter(include_in_schema=False)

CLI_EXAMPLE = "sxwl jobs submit --gpus 1 -- python3 train.py"


def _helpers(lang: str) -> dict[str, Any]:
    return {
        "state_name": lambda state: jobs_view.state_name(lang, state),
        "duration": lambda seconds: jobs_view.duration(lang, seconds),
        "cli_example": CLI_EXAMPLE,
    }


# ---- the list -------------------------------------------------------------------------------


def _list_query(request: Request) -> dict[str, Any]:
    params = request.query_params
    view = params.get("view", "all")
    try:
        page = int(params.get("page", "1"))
    except ValueError:
        page = 1
    if not 1 <= page <= INT32_MAX:  # out of bounds, like a malformed one: the first page
        page = 1
    return {
        "view": view if view in jobs_view.VIEWS else "all",
        "q": params.get("q", "").strip()[:100],
        "page": page,
        "everyone": params.get("all") == "1",
    }


def _list_values(request: Request, principal: Principal) -> dict[str, Any]:
    lang = language(request)
    query = _list_query(request)
    everyone = query["everyone"] and principal.user.role == Role.ADMIN
    with ctx_of(request).db.session() as session:
        listing = jobs_view.job_list(
            session, principal.user, lang, utcnow(), query["view"], query["q"], query["page"], everyone
        )

    def link(**changes: Any) -> str:
        """This list's URL with some parameters changed (a tab resets the page)."""
        values = {"view": query["view"], "q": query["q"], "page": query["page"], "all": everyone} | changes
        kept = {
            k: ("1" if v is True else v)
            for k, v in values.items()
            if v not in ("", None, False)
            and not (k == "view" and v == "all")
            and not (k == "page" and v == 1)
        }
        return "/jobs" + ("?" + urlencode(kept) if kept else "")

    return {
        "listing": listing,
        "view": query["view"],
        "q": query["q"],
        "everyone": everyone,
        "is_admin": principal.user.role == Role.ADMIN,
        "views": list(jobs_view.VIEWS),
        "link": link,
        **_helpers(lang),
    }


@router.get("/jobs")
def jobs_page(request: Request, principal: JobsViewer) -> Response:
    return live_detail.list_page(
        request, principal, "jobs.html", "/jobs/fragment", _list_values(request, principal)
    )


@router.get("/jobs/fragment")
def jobs_fragment(request: Request, principal: JobsFragmentViewer) -> Response:
    return render(request, "_jobs_live.html", principal, **_list_values(request, principal))


# ---- the submit form ------------------------------------------------------------------------


def _form(
    request: Request,
    principal: Principal,
    form: dict[str, str] | None = None,
    errors: dict[str, str] | None = None,
    status: int = 200,
    funds_link: money_view.FundsLink | None = None,
) -> Response:
    lang = language(request)
    billed = ctx_of(request).settings.billing_enabled
    with ctx_of(request).db.session() as session:
        gpu_types = cpods.gpu_types(session)
        shown = jobs_view.form_defaults(gpu_types) | (form or {})
        estimate = money_view.estimate_text(lang, session, money_view.form_spec(shown)) if billed else ""
        prices = money_view.form_prices(price_book(session)) if billed else {}
    return render(
        request,
        "job_new.html",
        principal,
        status=status,
        path="/jobs/new",
        form=shown,
        errors=errors or {},
        gpu_types=gpu_types,
        known_products={g.product for g in gpu_types},
        estimate=estimate,
        prices=prices,
        max_runtime_min=jobs_view.MAX_RUNTIME_MIN,
        max_gpus_per_node=MAX_GPUS_PER_NODE,
        max_nodes=MAX_NODES,
        cli_example=CLI_EXAMPLE,
        funds_link=funds_link,
    )


@router.get("/jobs/new")
def new_job_page(request: Request, principal: JobsViewer) -> Response:
    return _form(request, principal)


@router.post("/jobs/new")
async def submit_job(request: Request, principal: JobsViewer) -> Response:
    ctx, lang = ctx_of(request), language(request)
    raw = await request.form()
    form = {k: str(raw.get(k, "")) for k in jobs_view.FORM_FIELDS}
    if not csrf_ok(request, str(raw.get("csrf_token", ""))):
        return _form(request, principal, form, {"form": translate(lang, "error.csrf")}, 403)
    body, errors = jobs_view.validate_form(lang, form)
    if body is None:
        return _form(request, principal, form, errors, 422)
    try:
        with ctx.db.session() as session:
            job = job_service.submit(ctx, session, session.merge(principal.user), body)
            job_id = job.id
    except AppError as exc:
        # Every refusal is said above the form, which keeps what was typed.
        if exc.status == 402:
            message, link = money_view.short_of_funds(lang, exc, principal.user.role)
            return _form(request, principal, form, {"form": message}, 402, link)
        if exc.status == 422:
            return _form(request, principal, form, jobs_view.submit_errors(lang, exc), 422)
        return _form(request, principal, form, {"form": exc.message}, exc.status)
    return redirect(f"/jobs/{job_id}?notice=job_submitted")


# ---- one job --------------------------------------------------------------------------------


def _job_values(request: Request, principal: Principal, job_id: str) -> dict[str, Any]:
    lang = language(request)
    with ctx_of(request).db.session() as session:
        detail = jobs_view.job_detail(session, principal.user, lang, job_id, utcnow())
        owner_email = detail.job.owner.email
        cost = billing.job_cost(session, detail.job) if ctx_of(request).settings.billing_enabled else None
    return {
        "d": detail,
        "job": detail.job,
        "title": f"{detail.job.name} · {translate(lang, 'jobs.title')}",
        "live_state": detail.job.state.value,
        "owner_email": owner_email,
        "cost": cost,
        "is_admin": principal.user.role == Role.ADMIN,
        "mine": detail.job.owner_id == principal.user.id,
        **_helpers(lang),
    }


def _cancel(session: Session, user: User, job_id: str) -> str:
    done = job_service.cancel(session, user, job_id).state.value == "cancelled"
    return f"notice={'job_cancelled' if done else 'job_cancel_requested'}"


def _banner(lang: str, request: Request, values: dict[str, Any]) -> str | None:
    notice = request.query_params.get("notice")
    if notice == "job_cancel_requested" and values["d"].terminal:  # stopped before the page was read
        notice = "job_cancelled"
    return translate(lang, f"notice.{notice}") if notice in JOB_NOTICES else None


JOB_NOTICES = ("job_submitted", "job_cancelled", "job_cancel_requested")
JOB_PAGE = live_detail.DetailKind(
    path="/jobs",
    fragment="_job_live.html",
    live_id="job-live",
    banner_id="job-notice",
    back="job.back",
    values=_job_values,
    cancel=_cancel,
    banner=_banner,
    finished=lambda lang, v: translate(
        lang, "job.cancel_conflict", state=jobs_view.state_name(lang, v["live_state"])
    ),
)

live_detail.add_routes(router, JOB_PAGE)
