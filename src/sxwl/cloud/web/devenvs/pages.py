"""The console's Dev environments page (开发环境): the caller's environments with Open, Pause,
Resume and Stop, and the form that creates one with its GPUs, models and files. Everything goes
through the same services as the REST API; the environment itself opens at /dev/<id>/ (proxy.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError

from sxwl.cloud.api.deps import Principal, csrf_ok
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.errors import AppError
from sxwl.cloud.services.catalog import model_catalog
from sxwl.cloud.services.catalog.storage_quota import size_text
from sxwl.cloud.services.devenvs import dev_envs, storage
from sxwl.cloud.services.finetune import datasets
from sxwl.cloud.services.fleet import cpods
from sxwl.cloud.services.money import billing
from sxwl.cloud.web.i18n import translate
from sxwl.cloud.web.i18n.reasons import reason_text
from sxwl.cloud.web.kit import JobsViewer, ctx_of, language, redirect, render
from sxwl.protocol.devenvs import (
    DEFAULT_IDLE_TIMEOUT_MIN,
    MAX_CPUS,
    MAX_IDLE_TIMEOUT_MIN,
    MAX_MEMORY_GIB,
    DevEnvIn,
    base_url,
)
from sxwl.protocol.jobs import MAX_GPUS_PER_NODE
from sxwl.protocol.money import money_text

router = APIRouter(include_in_schema=False)
PAGE = "/dev-envs"
NOTICES = ("dev_created", "dev_paused", "dev_resumed", "dev_stopped")
CLI_EXAMPLE = "sxwl dev create --gpus 1 --model tiny-llama"


def _rows(request: Request, principal: Principal) -> list[dict[str, Any]]:
    lang, now = language(request), utcnow()
    with ctx_of(request).db.session() as session:
        found = dev_envs.list_for(session, principal.user)
        costs = billing.job_costs(session, [job.id for _, job in found if job is not None])
        kept = storage.totals(session, [env.id for env, _ in found])
        rows = []
        for env, job in found:
            status = dev_envs.status(env, job)
            running = status == dev_envs.Status.RUNNING and job is not None and job.started_at is not None
            cost = costs.get(job.id) if job is not None else None
            reason = env.reason or (
                job.reason if job is not None and status != dev_envs.Status.RUNNING else None
            )
            rows.append(
                {
                    "id": env.id,
                    "name": env.name,
                    "status": status.value,
                    "gpus": env.gpus,
                    "gpu_product": env.gpu_product,
                    "cpus": env.cpus,
                    "memory_gib": env.memory_gib,
                    "saved_bytes": env.saved["size"] if env.saved else None,
                    "saved_size": size_text(env.saved["size"]) if env.saved else "",
                    "storage_cost": money_text(kept[env.id]) if kept.get(env.id) else "",
                    "cpod_id": (job.cpod_id if job is not None else None) or env.cpod_id,
                    "running_min": int((now - job.started_at).total_seconds() // 60)
                    if running and job and job.started_at
                    else None,
                    "cost": money_text(cost.cost if cost else 0),
                    "idle_timeout_min": env.idle_timeout_min,
                    "reason": reason_text(lang, reason) if reason else "",
                    "url": base_url(env.id),
                    "mounts": env.mounts,
                }
            )
    return rows


def _page(
    request: Request, principal: Principal, form: dict[str, Any] | None = None,
    errors: dict[str, str] | None = None, status: int = 200,
) -> Response:  # fmt: skip
    lang = language(request)
    notice = request.query_params.get("notice")
    with ctx_of(request).db.session() as session:
        models = [m.name for m in model_catalog.visible(session, user=principal.user)]
        files, _ = datasets.list_for(session, owner_id=principal.user.id, after=None, limit=200)
        file_choices = [(f.id, f.filename) for f in files]
        gpu_types = cpods.gpu_types(session)
    return render(
        request,
        "dev_envs.html",
        principal,
        status=status,
        path=PAGE,
        envs=_rows(request, principal),
        form=form or {"idle_timeout_min": DEFAULT_IDLE_TIMEOUT_MIN, "gpus": 0},
        errors=errors or {},
        models=models,
        files=file_choices,
        gpu_types=gpu_types,
        max_gpus=MAX_GPUS_PER_NODE,
        max_idle=MAX_IDLE_TIMEOUT_MIN,
        max_cpus=MAX_CPUS,
        max_memory_gib=MAX_MEMORY_GIB,
        cli_example=CLI_EXAMPLE,
        banner=translate(lang, f"notice.{notice}") if notice in NOTICES else None,
    )


@router.get(PAGE)
def dev_envs_page(request: Request, principal: JobsViewer) -> Response:
    return _page(request, principal)


def _field_errors(lang: str, exc: ValidationError) -> dict[str, str]:
    return {
        str(e["loc"][0]) if e["loc"] else "form": translate(lang, "dev.field_invalid") for e in exc.errors()
    }


@router.post(PAGE)
async def create_dev_env(request: Request, principal: JobsViewer) -> Response:
    ctx, lang = ctx_of(request), language(request)
    raw = await request.form()
    form: dict[str, Any] = {
        k: str(raw.get(k, "")).strip()
        for k in ("name", "gpus", "gpu_product", "cpus", "memory_gib", "idle_timeout_min")
    }
    form["models"] = [str(v) for v in raw.getlist("models")]
    form["files"] = [str(v) for v in raw.getlist("files")]
    if not csrf_ok(request, str(raw.get("csrf_token", ""))):
        return _page(request, principal, form, {"form": translate(lang, "error.csrf")}, 403)
    values = {k: v for k, v in form.items() if v not in ("", [])}
    try:
        body = DevEnvIn.model_validate(values, strict=False)
    except ValidationError as exc:
        return _page(request, principal, form, _field_errors(lang, exc), 422)
    try:
        with ctx.db.session() as session:
            dev_envs.create(ctx, session, owner=session.merge(principal.user), request=body)
    except AppError as exc:
        return _page(request, principal, form, {"form": exc.message}, exc.status)
    return redirect(f"{PAGE}?notice=dev_created")


async def _act(request: Request, principal: Principal, env_id: str, action: str) -> Response:
    ctx, lang = ctx_of(request), language(request)
    raw = await request.form()
    if not csrf_ok(request, str(raw.get("csrf_token", ""))):
        return _page(request, principal, None, {"list": translate(lang, "error.csrf")}, 403)
    try:
        with ctx.db.session() as session:
            user = session.merge(principal.user)
            if action == "pause":
                dev_envs.pause(session, user, env_id, dev_envs.paused_by(user))
            elif action == "resume":
                dev_envs.resume(ctx, session, user, env_id)
            else:
                dev_envs.stop(session, user, env_id)
    except AppError as exc:  # said over the list the row is in, not on the create form
        return _page(request, principal, None, {"list": exc.message}, exc.status)
    return redirect(f"{PAGE}?notice=dev_{'stopped' if action == 'stop' else action + 'd'}")


@router.post(PAGE + "/{env_id}/pause")
async def pause_dev_env(env_id: str, request: Request, principal: JobsViewer) -> Response:
    return await _act(request, principal, env_id, "pause")


@router.post(PAGE + "/{env_id}/resume")
async def resume_dev_env(env_id: str, request: Request, principal: JobsViewer) -> Response:
    return await _act(request, principal, env_id, "resume")


@router.post(PAGE + "/{env_id}/stop")
async def stop_dev_env(env_id: str, request: Request, principal: JobsViewer) -> Response:
    return await _act(request, principal, env_id, "stop")
