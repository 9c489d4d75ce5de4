"""模型 (Models): the base models a compute user may fine-tune (public ones and their own) and the
adapters their fine-tunes produced, each with a link to its fine-tune and its download. The same
catalogue as ``GET /v1/models`` (services/catalog/model_catalog.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from fastapi import APIRouter, Request
from fastapi.responses import Response

from sxwl.cloud.db.finetune_models import CatalogModel, ModelKind
from sxwl.cloud.services.catalog import model_catalog
from sxwl.cloud.web.finetune import view as finetune_view
from sxwl.cloud.web.jobs import view as jobs_view
from sxwl.cloud.web.kit import JobsViewer, ctx_of, render

router = APIRouter(include_in_schema=False)


@dataclass(frozen=True)
class ModelRow:
    name: str
    public: bool
    parameters: str  # "1.5B"; "" where unknown
    architecture: str | None
    size: str
    bytes: int
    created_at: datetime
    base: str | None  # an adapter's base model
    fine_tune_id: str | None  # the fine-tune that produced an adapter
    download_url: str


def model_row(model: CatalogModel) -> ModelRow:
    return ModelRow(
        name=model.name,
        public=model.owner_id is None,
        parameters=finetune_view.params_text(model.parameters),
        architecture=model.architecture,
        size=jobs_view.size(model.bytes),
        bytes=model.bytes,
        created_at=model.created_at,
        base=model.base.name if model.base is not None else None,
        fine_tune_id=model.fine_tune_id,
        download_url=finetune_view.model_url(model.name),
    )


@router.get("/models")
def models_page(request: Request, principal: JobsViewer) -> Response:
    with ctx_of(request).db.session() as session:
        rows = [(m.kind, model_row(m)) for m in model_catalog.visible(session, user=principal.user)]
    return render(
        request,
        "models.html",
        principal,
        # Newest first: a fine-tune that just succeeded is the adapter looked for.
        base_models=[r for kind, r in reversed(rows) if kind == ModelKind.BASE],
        adapters=[r for kind, r in reversed(rows) if kind == ModelKind.ADAPTER],
    )
