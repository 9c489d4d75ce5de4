"""The model catalogue: OpenAI-compatible listing (``/v1/models``), and our extensions under
``/api/v1``: a user's own base model, an admin's public one, and downloads of a model's tar."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from sxwl.cloud.api.deps import Ctx, CurrentAdmin, CurrentUser
from sxwl.cloud.api.jobs import ARTIFACT_HEADERS, ARTIFACT_TYPE
from sxwl.cloud.api.openai.callers import ListingCaller
from sxwl.cloud.api.openai.catalog_schemas import ModelListOut, ModelOut, endpoint_model_out, model_out
from sxwl.cloud.api.openai.files import DOWNLOAD
from sxwl.cloud.api.responses import SIGNED_IN, WITH_BODY, errors
from sxwl.cloud.api.uploads import MULTIPART_SLACK, CallerRoom, multipart_body, read_upload
from sxwl.cloud.edge.body_rules import body_rule
from sxwl.cloud.services.catalog import model_catalog
from sxwl.cloud.services.endpoints import routing

router = APIRouter(prefix="/models", tags=["models"], responses=SIGNED_IN)  # mounted at /v1
api_router = APIRouter(tags=["models"], responses=SIGNED_IN)  # mounted at /api/v1
NOT_FOUND = errors(404)
UPLOAD_ERRORS = WITH_BODY | errors(409, 503)
MODEL_FIELDS = {"name": (100, "the model's id: letters, digits, '.', '_', '-'")}
MODEL_FORM = multipart_body("tar or tar.gz of a model directory, files at its root", MODEL_FIELDS)


@router.get("", response_model=ModelListOut)
def list_models(caller: ListingCaller, ctx: Ctx) -> ModelListOut:
    """Public models, the caller's own base models and the adapters of their fine-tunes, then the
    caller's ready endpoints (docs/endpoints.md). An inference key lists them too."""
    user = caller.user
    with ctx.db.session() as session:
        catalogue = [model_out(m) for m in model_catalog.visible(session, user=user)]
        serving = [
            endpoint_model_out(name, serves, created, user.id)
            for name, serves, created in routing.ready_names(session, user.id)
        ]
        return ModelListOut(data=catalogue + serving)


@router.get("/{model_id}", response_model=ModelOut, responses=NOT_FOUND)
def get_model(model_id: str, user: CurrentUser, ctx: Ctx) -> ModelOut:
    with ctx.db.session() as session:
        return model_out(model_catalog.get_visible(session, user=user, model_id=model_id))


@api_router.post(
    "/models", status_code=201, response_model=ModelOut, responses=UPLOAD_ERRORS, openapi_extra=MODEL_FORM
)
@body_rule(lambda s: (s.model_max_bytes + MULTIPART_SLACK, s.artifact_upload_timeout_s))
async def upload_model(request: Request, room: CallerRoom, user: CurrentUser, ctx: Ctx) -> ModelOut:
    """A base model only its uploader sees: 422 naming ``file`` says what the archive lacks. The
    caller and their storage quota are checked before the body is read."""
    upload = await read_upload(request, MODEL_FIELDS, room)
    try:
        model = await model_catalog.upload_base(
            ctx, owner=user, name=upload.text("name"), archive=upload.file.file
        )
    finally:
        await upload.file.close()
    return model_out(model)


@api_router.post(
    "/admin/models",
    status_code=201,
    response_model=ModelOut,
    responses=UPLOAD_ERRORS,
    openapi_extra=MODEL_FORM,
)
@body_rule(lambda s: (s.model_max_bytes + MULTIPART_SLACK, s.artifact_upload_timeout_s))
async def register_public_model(request: Request, admin: CurrentAdmin, ctx: Ctx) -> ModelOut:
    """A public base model (administrators only, checked before the body is read)."""
    upload = await read_upload(request, MODEL_FIELDS)
    try:
        model = await model_catalog.register_public(ctx, name=upload.text("name"), archive=upload.file.file)
    finally:
        await upload.file.close()
    return model_out(model)


@api_router.get("/models/{model_id}/content", response_class=Response, responses=DOWNLOAD | NOT_FOUND)
def model_content(model_id: str, user: CurrentUser, ctx: Ctx) -> Response:
    """The model's tar (a base model's archive, or an adapter): a redirect to it with the S3 store."""
    with ctx.db.session() as session:
        artifact = model_catalog.content(session, user=user, model_id=model_id)
    return ctx.artifacts.download(artifact, dict(ARTIFACT_HEADERS), ARTIFACT_TYPE)
