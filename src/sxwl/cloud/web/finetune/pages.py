"""Console pages of fine-tuning (微调): the list, the files (upload with the problems of each line
shown in place), the new fine-tune form, one fine-tune with its live progress and loss chart, cancel.

Compute users see their own fine-tunes (admins too, their own: like the job pages); providers get
403. Everything goes through the same services as the OpenAI-compatible API."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import Response
from sqlalchemy.orm import Session

from sxwl.cloud.api.deps import Principal, csrf_ok
from sxwl.cloud.api.uploads import MULTIPART_SLACK, declared_length, read_upload, storage_room
from sxwl.cloud.db.models import Role, User
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.edge.body_rules import body_rule
from sxwl.cloud.errors import AppError
from sxwl.cloud.services.catalog import storage_quota
from sxwl.cloud.services.finetune import datasets, fine_tunes
from sxwl.cloud.services.fleet import cpods
from sxwl.cloud.web.finetune import form as finetune_form
from sxwl.cloud.web.finetune import view as finetune_view
from sxwl.cloud.web.finetune.chart import Chart
from sxwl.cloud.web.i18n import translate
from sxwl.cloud.web.jobs import live_detail
from sxwl.cloud.web.jobs import view as jobs_view
from sxwl.cloud.web.kit import (
    JobsFragmentViewer,
    JobsViewer,
    ctx_of,
    error_page,
    language,
    redirect,
    render,
)
from sxwl.cloud.web.money import view as money_view
from sxwl.protocol.finetune import MAX_BATCH_SIZE, MAX_EPOCHS, MAX_LR_MULTIPLIER
from sxwl.protocol.jobs import MAX_GPUS_PER_NODE

router = APIRouter(include_in_schema=False)

CLI_EXAMPLE = "sxwl files upload train.jsonl\nsxwl finetune create --model <model> --training-file file-…"


def _helpers(lang: str) -> dict[str, Any]:
    return {
        "status_name": lambda status: finetune_view.status_name(lang, status),
        "duration": lambda seconds: jobs_view.duration(lang, seconds),
        "params_text": finetune_view.params_text,
        "problem_text": lambda message: finetune_view.problem_text(lang, message),
        "reason_text": lambda text: jobs_view.reason(lang, text),
        "size": jobs_view.size,
        "chart_box": Chart,
        "cli_example": CLI_EXAMPLE,
    }


def _seconds_left(row: finetune_view.FineTuneRow) -> int | None:
    if row.finish_at is None:
        return None
    return max(int((row.finish_at - utcnow()).total_seconds()), 0)


# ---- the list -------------------------------------------------------------------------------


def _list_values(request: Request, principal: Principal) -> dict[str, Any]:
    after = request.query_params.get("after", "").strip()[:64] or None
    everyone = request.query_params.get("all") == "1" and principal.user.role == Role.ADMIN
    try:
        with ctx_of(request).db.session() as session:
            listing = finetune_view.fine_tune_list(
                session, principal.user, utcnow(), after, everyone=everyone
            )
    except AppError:  # an `after` that is not one of theirs: the first page
        with ctx_of(request).db.session() as session:
            listing = finetune_view.fine_tune_list(session, principal.user, utcnow(), None, everyone=everyone)
        after = None
    return {
        "listing": listing,
        "after": after,
        "everyone": everyone,
        "is_admin": principal.user.role == Role.ADMIN,
        "all_query": "all=1&" if everyone else "",
        "seconds_left": _seconds_left,
        **_helpers(language(request)),
    }


@router.get("/finetune")
def finetune_list_page(request: Request, principal: JobsViewer) -> Response:
    values = _list_values(request, principal)
    return live_detail.list_page(request, principal, "finetune_list.html", "/finetune/fragment", values)


@router.get("/finetune/fragment")
def finetune_list_fragment(request: Request, principal: JobsFragmentViewer) -> Response:
    return render(request, "_finetune_list_live.html", principal, **_list_values(request, principal))


# ---- files ----------------------------------------------------------------------------------


def _files(
    request: Request,
    principal: Principal,
    uploaded: str | None = None,
    error: str | None = None,
    status: int = 200,
    files_error: str | None = None,
) -> Response:
    lang = language(request)
    with ctx_of(request).db.session() as session:
        files = finetune_view.file_rows(session, principal.user)
    result = next((f for f in files if f.id == uploaded), None) if uploaded else None
    deleted = request.query_params.get("deleted", "")[:200]
    notice = translate(lang, "ft.files.deleted", name=deleted) if deleted and not files_error else None
    return render(
        request,
        "finetune_files.html",
        principal,
        status=status,
        path="/finetune/files",
        files=files,
        result=result,
        upload_error=error,
        files_error=files_error,
        files_notice=notice,
        max_bytes=ctx_of(request).settings.file_max_bytes,
        **_helpers(language(request)),
    )


@router.get("/finetune/files")
def files_page(request: Request, principal: JobsViewer) -> Response:
    return _files(request, principal, uploaded=request.query_params.get("uploaded"))


@router.post("/finetune/files")
@body_rule(lambda s: (s.file_max_bytes + MULTIPART_SLACK, s.artifact_upload_timeout_s))
async def upload_file(request: Request, principal: JobsViewer) -> Response:
    """Signed in (the dependency) and within the storage quota before a byte of the body is read."""
    ctx, lang = ctx_of(request), language(request)
    try:
        room = await asyncio.to_thread(storage_room, ctx, principal.user.id, declared_length(request))
        upload = await read_upload(request, {"csrf_token": (128, "the form's CSRF token")}, room)
    except AppError as exc:
        return _upload_refused(request, principal, exc)
    try:
        if not csrf_ok(request, upload.fields.get("csrf_token")):
            return _files(request, principal, error=translate(lang, "error.csrf"), status=403)
        if not (upload.file.filename or upload.file.size):
            return _files(request, principal, error=translate(lang, "ft.files.choose"), status=422)
        stored = await datasets.upload(
            ctx,
            owner_id=principal.user.id,
            filename=upload.file.filename or "",
            purpose="fine-tune",
            chunks=upload.chunks(),
        )
    except AppError as exc:
        return _upload_refused(request, principal, exc)
    finally:
        await upload.file.close()
    # The file is recorded either way (one with problems too, so its lines can be read): show it.
    return redirect(f"/finetune/files?uploaded={stored.id}")


@router.post("/finetune/files/{file_id}/delete")
async def delete_file(file_id: str, request: Request, principal: JobsViewer) -> Response:
    """Deletes one of the user's datasets; any refusal (one a fine-tune uses) is said above the list."""
    ctx, lang = ctx_of(request), language(request)
    form = await request.form()
    if not csrf_ok(request, str(form.get("csrf_token", ""))):
        return _files(request, principal, status=403, files_error=translate(lang, "error.csrf"))
    with ctx.db.session() as session:
        row = next((f for f in finetune_view.file_rows(session, principal.user) if f.id == file_id), None)
    name = row.filename if row is not None else file_id
    try:
        await datasets.delete(ctx, owner_id=principal.user.id, file_id=file_id)
    except AppError as exc:
        if exc.status >= 500:
            return error_page(request, exc.status, principal)
        if exc.code == "file_in_use" and isinstance(exc.details, dict):
            used_by = exc.details.get("fine_tune", "")
            message = translate(lang, "ft.files.in_use", name=name, fine_tune=used_by)
        else:
            message = exc.message
        return _files(request, principal, status=exc.status, files_error=message)
    return redirect(f"/finetune/files?{urlencode({'deleted': name})}")


def _upload_refused(request: Request, principal: Principal, exc: AppError) -> Response:
    ctx, lang = ctx_of(request), language(request)
    if exc.code == storage_quota.CODE and isinstance(exc.details, dict):
        used, limit = exc.details["used_bytes"], exc.details["limit_bytes"]
        message = translate(lang, "storage.refused", used=jobs_view.size(used), limit=jobs_view.size(limit))
    elif exc.status == 413:
        message = translate(lang, "ft.files.too_large", max=jobs_view.size(ctx.settings.file_max_bytes))
    elif exc.status == 422 and isinstance(exc.details, list) and exc.details[0].get("field") == "file":
        message = translate(lang, "ft.files.choose")
    else:
        message = translate(lang, "ft.files.unavailable") if exc.status >= 500 else exc.message
    return _files(request, principal, error=message, status=exc.status if exc.status < 500 else 503)


# ---- the new fine-tune form -----------------------------------------------------------------


def _form(
    request: Request,
    principal: Principal,
    form: dict[str, str] | None = None,
    errors: dict[str, str] | None = None,
    status: int = 200,
    funds_link: money_view.FundsLink | None = None,
) -> Response:
    with ctx_of(request).db.session() as session:
        models = finetune_view.base_models(session, principal.user)
        files = finetune_view.training_files(session, principal.user)
        gpu_types = cpods.gpu_types(session)
        last_model = finetune_view.last_model(session, principal.user)
        fits = cpods.fine_tune_gpus(session)
    shown = finetune_form.defaults(models, files, last_model, fits) | (form or {})
    return render(
        request,
        "finetune_new.html",
        principal,
        status=status,
        path="/finetune/new",
        form=shown,
        errors=errors or {},
        models=models,
        files=files,
        gpu_types=gpu_types,
        known_products={g.product for g in gpu_types},
        gpus_fit=fits,
        funds_link=funds_link,
        limits={
            "epochs": MAX_EPOCHS,
            "batch_size": MAX_BATCH_SIZE,
            "lr": MAX_LR_MULTIPLIER,
            "gpus": MAX_GPUS_PER_NODE,
        },
        **_helpers(language(request)),
    )


@router.get("/finetune/new")
def new_finetune_page(request: Request, principal: JobsViewer) -> Response:
    # A link from the files page names the file to train on.
    chosen = {k: request.query_params.get(k, "")[:64] for k in ("training_file", "model")}
    return _form(request, principal, {k: v for k, v in chosen.items() if v})


@router.post("/finetune/new")
async def create_finetune(request: Request, principal: JobsViewer) -> Response:
    ctx, lang = ctx_of(request), language(request)
    raw = await request.form()
    form = {k: str(raw.get(k, "")) for k in finetune_form.FORM_FIELDS}
    if not csrf_ok(request, str(raw.get("csrf_token", ""))):
        return _form(request, principal, form, {"form": translate(lang, "error.csrf")}, 403)
    body, errors = finetune_form.validate_form(lang, form)
    if body is None:
        return _form(request, principal, form, errors, 422)
    try:
        with ctx.db.session() as session:
            fine_tune, _ = fine_tunes.create(ctx, session, owner=session.merge(principal.user), request=body)
            fine_tune_id = fine_tune.id
    except AppError as exc:
        # Every refusal is said in place: by its field where it names one, else above the form.
        if exc.status == 402:
            message, link = money_view.short_of_funds(lang, exc, principal.user.role)
            return _form(request, principal, form, {"form": message}, 402, link)
        shown = finetune_form.create_errors(lang, exc)
        return _form(request, principal, form, shown, 422 if exc.status == 404 else exc.status)
    return redirect(f"/finetune/{fine_tune_id}?created=1")


# ---- one fine-tune --------------------------------------------------------------------------


def _detail_values(request: Request, principal: Principal, fine_tune_id: str) -> dict[str, Any]:
    lang = language(request)
    with ctx_of(request).db.session() as session:
        detail = finetune_view.fine_tune_detail(session, principal.user, lang, fine_tune_id, utcnow())
    return {
        "d": detail,
        "ft": detail.fine_tune,
        "job": detail.job,
        "title": f"{detail.row.name} · {translate(lang, 'ft.title')}",
        "live_state": detail.row.status,
        "seconds_left": _seconds_left,
        **_helpers(lang),
    }


def _cancel(session: Session, user: User, fine_tune_id: str) -> str:
    fine_tunes.cancel(session, user, fine_tune_id)
    return "cancelled=1"


def _banner(lang: str, request: Request, values: dict[str, Any]) -> str | None:
    """What the form that sent the user here did; "waiting for GPUs" only while it is queued."""
    if request.query_params.get("created") == "1":
        queued = values["live_state"] in ("validating_files", "queued")
        return translate(lang, "ft.notice.created" if queued else "ft.notice.created_plain")
    return translate(lang, "ft.notice.cancelled") if request.query_params.get("cancelled") == "1" else None


FINE_TUNE_PAGE = live_detail.DetailKind(
    path="/finetune",
    fragment="_finetune_live.html",
    live_id="ft-live",
    banner_id="ft-notice",
    back="ft.back",
    values=_detail_values,
    cancel=_cancel,
    banner=_banner,
    finished=lambda lang, v: translate(
        lang, "ft.cancel_conflict", status=finetune_view.status_name(lang, v["live_state"])
    ),
)

live_detail.add_routes(router, FINE_TUNE_PAGE)
