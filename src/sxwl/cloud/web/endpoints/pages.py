"""推理服务 (Endpoints, docs/endpoints.md): the caller's endpoints (state, replicas, the URL and model
to call, model, requests and tokens today), a Deploy form (prefilled from the Models page's Deploy
buttons), delete, and the inference keys (a new key's secret shown once, its limits set and
changed, its spend this month, revoke). The same services
as ``/api/v1/endpoints`` and ``/api/v1/keys``."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError
from sqlalchemy.orm import Session

from sxwl.cloud.api.deps import Principal, csrf_ok
from sxwl.cloud.db.endpoint_models import InferenceKey
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.errors import AppError
from sxwl.cloud.services.catalog import model_catalog
from sxwl.cloud.services.endpoints import endpoints, inference_keys, key_limits, routing
from sxwl.cloud.services.fleet.engine_loads import SeenLoad
from sxwl.cloud.web.i18n import translate
from sxwl.cloud.web.i18n.reasons import reason_text
from sxwl.cloud.web.kit import JobsViewer, ctx_of, error_page, field_errors, language, redirect, render
from sxwl.protocol.endpoints import MAX_REPLICAS, EndpointRequest, KeyLimits
from sxwl.protocol.jobs import MAX_GPUS_PER_NODE
from sxwl.protocol.money import money_text, yuan

router = APIRouter(include_in_schema=False)
FORM_FIELDS = ("name", "model", "gpus", "gpu_product", "replicas")
LIMIT_FIELDS = ("rpm", "tpm", "monthly_cap")
# What each field takes, said under it when a value is refused: pydantic's own words are English
# and name its pattern or bound, not what the user should type.
TAKES = {
    "name": ("endpoints.field.name_hint", 0),
    "gpus": ("endpoints.field.gpus_range", MAX_GPUS_PER_NODE),
    "replicas": ("endpoints.field.replicas_range", MAX_REPLICAS),
    "key_rpm": ("endpoints.key_rpm_hint", 0),
    "key_tpm": ("endpoints.key_tpm_hint", 0),
    "key_monthly_cap": ("endpoints.key_monthly_cap_hint", 0),
}


def _said(lang: str, errors: dict[str, str]) -> dict[str, str]:
    """Each refused field's message in the page's language, with what it takes (a missing value
    keeps the kit's "required")."""
    required = translate(lang, "error.required")
    said = {}
    for field, message in errors.items():
        if field in TAKES and message != required:
            key, most = TAKES[field]
            message = translate(lang, "endpoints.invalid", takes=translate(lang, key, max=most))
        said[field] = message
    return said


@dataclass(frozen=True)
class EndpointRow:
    id: str
    name: str
    model: str
    state: str
    reason: str
    ready: int
    replicas: int
    requests_today: int
    tokens_today: int
    load: str  # the serving replicas' engine load, summed ("" when none was reported)


def _load(lang: str, seen: list[SeenLoad | None]) -> str:
    """The engines' requests running and waiting, summed; waiting only where every engine says."""
    said = [s.load for s in seen if s is not None]
    if not said:
        return ""
    running = sum(load.running for load in said)
    if any(load.waiting is None for load in said):
        return translate(lang, "endpoints.load_running", running=running)
    return translate(lang, "endpoints.load", running=running, waiting=sum(load.waiting or 0 for load in said))


@dataclass(frozen=True)
class KeyRow:
    id: str
    name: str
    prefix: str
    revoked: bool
    rpm: str
    tpm: str
    monthly_cap: str  # decimal yuan, as the form takes it; "" for none
    spent: str  # for people: ¥ with two places


def _key_row(session: Session, key: InferenceKey) -> KeyRow:
    spent = key_limits.spent_this_month(session, key, utcnow()) if key.revoked_at is None else 0
    return KeyRow(
        id=key.id,
        name=key.name,
        prefix=key.prefix,
        revoked=key.revoked_at is not None,
        rpm="" if key.rpm is None else str(key.rpm),
        tpm="" if key.tpm is None else str(key.tpm),
        monthly_cap="" if key.monthly_cap is None else f"{yuan(key.monthly_cap):f}",
        spent=money_text(spent),
    )


def _rows(request: Request, principal: Principal) -> tuple[list[EndpointRow], list[KeyRow], list[str]]:
    lang, today = language(request), utcnow().strftime("%Y-%m-%d")
    loads = ctx_of(request).engine_loads
    with ctx_of(request).db.session() as session:
        rows = []
        for view in endpoints.list_for(session, principal.user):
            used = [u for u in routing.usage(session, view.endpoint.id) if u.day == today]
            rows.append(
                EndpointRow(
                    id=view.endpoint.id,
                    name=view.endpoint.name,
                    model=view.endpoint.model_name,
                    state=view.state.value,
                    reason=reason_text(lang, view.reason),
                    ready=len(view.ready),
                    replicas=view.endpoint.replicas,
                    requests_today=sum(u.requests for u in used),
                    tokens_today=sum(u.prompt_tokens + u.completion_tokens for u in used),
                    load=_load(lang, [endpoints.load_of(loads, job) for job in view.ready]),
                )
            )
        keys = [_key_row(session, k) for k in inference_keys.list_for(session, principal.user)]
        models = [m.name for m in model_catalog.visible(session, user=principal.user)]
    return rows, keys, models


def _page(
    request: Request,
    principal: Principal,
    form: dict[str, str],
    errors: dict[str, str] | None = None,
    status: int = 200,
    new_key: str | None = None,
) -> Response:
    rows, keys, models = _rows(request, principal)
    base_url = str(request.base_url).rstrip("/") + "/v1"
    return render(
        request,
        "endpoints.html",
        principal,
        status=status,
        endpoints=rows,
        keys=keys,
        models=models,
        form=form,
        errors=errors or {},
        base_url=base_url,
        new_key=new_key,
    )


@router.get("/endpoints")
def endpoints_page(request: Request, principal: JobsViewer) -> Response:
    model = request.query_params.get("model", "")
    name = model.replace(":", "-")[:63] if model else ""
    form = {"name": name, "model": model, "gpus": "1", "gpu_product": "", "replicas": "1"}
    return _page(request, principal, form)


@router.get("/endpoints/{endpoint_id}/playground")
def playground(request: Request, principal: JobsViewer, endpoint_id: str) -> Response:
    """A chat with the endpoint, streamed (static/playground.js calls /v1 with this session)."""
    try:
        with ctx_of(request).db.session() as session:
            view = endpoints.view(session, endpoints.get(session, principal.user, endpoint_id))
    except AppError as exc:
        return error_page(request, exc.status, principal)
    return render(
        request,
        "endpoint_playground.html",
        principal,
        path="/endpoints",  # the nav marks 推理服务 on its endpoints' pages too
        endpoint_name=view.endpoint.name,
        state=view.state.value,
    )


@router.post("/endpoints/deploy")
async def deploy(request: Request, principal: JobsViewer) -> Response:
    ctx, lang = ctx_of(request), language(request)
    raw = await request.form()
    form = {k: str(raw.get(k, "")).strip() for k in FORM_FIELDS}
    if not csrf_ok(request, str(raw.get("csrf_token", ""))):
        return _page(request, principal, form, {"form": translate(lang, "error.csrf")}, 403)
    values = {k: v for k, v in form.items() if v != ""}
    try:
        body = EndpointRequest.model_validate(values, strict=False)
    except ValidationError as exc:
        return _page(request, principal, form, _said(lang, field_errors(lang, exc)), 422)
    try:
        with ctx.db.session() as session:
            endpoints.create(ctx, session, owner=session.merge(principal.user), request=body)
    except AppError as exc:
        errors = field_errors(lang, exc) if isinstance(exc.details, list) else {}
        errors.setdefault("form", translate(lang, "endpoints.refused", why=exc.message))
        return _page(request, principal, form, errors, exc.status)
    return redirect("/endpoints")


@router.post("/endpoints/{endpoint_id}/delete")
async def delete(request: Request, principal: JobsViewer, endpoint_id: str) -> Response:
    raw = await request.form()
    if not csrf_ok(request, str(raw.get("csrf_token", ""))):
        return _page(request, principal, {}, {"list": translate(language(request), "error.csrf")}, 403)
    try:
        with ctx_of(request).db.session() as session:
            endpoints.delete(session, session.merge(principal.user), endpoint_id)
    except AppError as exc:  # another user's, or none: said over the list, not on the deploy form
        return _page(request, principal, {}, {"list": exc.message}, exc.status)
    return redirect("/endpoints")


def _limits(lang: str, raw: dict[str, str]) -> KeyLimits | dict[str, str]:
    """The form's limits (an empty field: none), or each refused field's message."""
    values = {k: v for k, v in raw.items() if v != ""}
    try:
        return KeyLimits.model_validate(values, strict=False)
    except ValidationError as exc:
        return _said(lang, {f"key_{field}": message for field, message in field_errors(lang, exc).items()})


@router.post("/endpoints/keys")
async def create_key(request: Request, principal: JobsViewer) -> Response:
    lang = language(request)
    raw = await request.form()
    if not csrf_ok(request, str(raw.get("csrf_token", ""))):
        return _page(request, principal, {}, {"key": translate(lang, "error.csrf")}, 403)
    form = {f"key_{k}": str(raw.get(f"key_{k}", "")).strip() for k in ("name", *LIMIT_FIELDS)}
    name = form["key_name"] or "key"
    if len(name) > 100:
        return _page(request, principal, form, {"key_name": translate(lang, "error.too_long")}, 422)
    limits = _limits(lang, {k: form[f"key_{k}"] for k in LIMIT_FIELDS})
    if not isinstance(limits, KeyLimits):
        return _page(request, principal, form, limits, 422)
    given = inference_keys.Limits(rpm=limits.rpm, tpm=limits.tpm, monthly_cap=limits.monthly_cap)
    try:
        with ctx_of(request).db.session() as session:
            made = inference_keys.create(session, session.merge(principal.user), name, given)
            secret = made.secret
    except AppError as exc:  # too many keys
        return _page(request, principal, form, {"key": exc.message}, exc.status)
    return _page(request, principal, {}, new_key=secret)  # shown in this answer only


@router.post("/endpoints/keys/{key_id}/limits")
async def change_key(request: Request, principal: JobsViewer, key_id: str) -> Response:
    """Sets all three limits as the row's form shows them (an emptied field lifts that limit)."""
    lang = language(request)
    raw = await request.form()
    if not csrf_ok(request, str(raw.get("csrf_token", ""))):
        return _page(request, principal, {}, {"key": translate(lang, "error.csrf")}, 403)
    limits = _limits(lang, {k: str(raw.get(k, "")).strip() for k in LIMIT_FIELDS})
    if not isinstance(limits, KeyLimits):
        named = [(translate(lang, f"endpoints.{field}"), message) for field, message in limits.items()]
        why = "; ".join(f"{label}: {message}" for label, message in named)
        return _page(request, principal, {}, {"key": translate(lang, "endpoints.key_refused", why=why)}, 422)
    changes = {field: getattr(limits, field) for field in LIMIT_FIELDS}
    try:
        with ctx_of(request).db.session() as session:
            inference_keys.change(session, session.merge(principal.user), key_id, changes)
    except AppError as exc:
        return _page(request, principal, {}, {"key": exc.message}, exc.status)
    return redirect("/endpoints")


@router.post("/endpoints/keys/{key_id}/revoke")
async def revoke_key(request: Request, principal: JobsViewer, key_id: str) -> Response:
    raw = await request.form()
    if not csrf_ok(request, str(raw.get("csrf_token", ""))):
        return _page(request, principal, {}, {"key": translate(language(request), "error.csrf")}, 403)
    try:
        with ctx_of(request).db.session() as session:
            inference_keys.revoke(session, session.merge(principal.user), key_id)
    except AppError as exc:
        return _page(request, principal, {}, {"key": exc.message}, exc.status)
    return redirect("/endpoints")
