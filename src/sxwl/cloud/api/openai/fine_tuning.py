"""OpenAI's fine-tuning API (``/v1/fine_tuning/jobs``), for the ``openai`` client with
``base_url=<cloud>/v1`` and a user's API token: create, list, look, cancel, events, checkpoints."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query
from sqlalchemy.orm import Session

from sxwl.cloud.api.deps import Ctx, CurrentUser
from sxwl.cloud.api.openai.fine_tuning_schemas import (
    CheckpointMetricsOut,
    CostOut,
    FineTuneErrorOut,
    FineTuningCheckpointListOut,
    FineTuningCheckpointOut,
    FineTuningEventListOut,
    FineTuningEventOut,
    FineTuningJobListOut,
    FineTuningJobOut,
    HyperparametersOut,
    ProgressOut,
)
from sxwl.cloud.api.responses import SIGNED_IN, WITH_BODY, errors
from sxwl.cloud.db.finetune_models import FineTune, FineTuneCheckpoint
from sxwl.cloud.db.models import Job
from sxwl.cloud.services.finetune import fine_tune_estimate, fine_tunes
from sxwl.cloud.services.finetune.fine_tune_outputs import model_name
from sxwl.protocol.finetune import FineTuneRequest
from sxwl.protocol.reasons import english

PREFIX = "/fine_tuning/jobs"  # mounted at /v1
router = APIRouter(prefix=PREFIX, tags=["fine-tuning"], responses=SIGNED_IN)
NOT_FOUND = errors(404)
After = Annotated[str | None, Query(max_length=64, description="the last id of the previous page")]
Limit = Annotated[int, Query(ge=1, le=100)]


def _unix(at: datetime | None) -> int | None:
    return int(at.timestamp()) if at is not None else None


def job_out(session: Session, fine_tune: FineTune, job: Job) -> FineTuningJobOut:
    return _out(fine_tune, job, fine_tune_estimate.estimate(session, fine_tune, job))


def _out(fine_tune: FineTune, job: Job, estimate: fine_tune_estimate.Estimate) -> FineTuningJobOut:
    status = fine_tunes.status(fine_tune, job)
    error = None
    if status == fine_tunes.Status.FAILED:
        error = FineTuneErrorOut(code="job_failed", message=english(job.reason) or "the job failed")
    return FineTuningJobOut(
        id=fine_tune.id,
        model=fine_tune.model_name,
        created_at=_unix(fine_tune.created_at) or 0,
        finished_at=_unix(fine_tune.finished_at),
        fine_tuned_model=fine_tune.fine_tuned_model,
        organization_id=fine_tune.owner_id,
        result_files=[],
        status=status.value,
        validation_file=fine_tune.validation_file,
        training_file=fine_tune.training_file,
        hyperparameters=HyperparametersOut.model_validate(fine_tune.hyperparameters),
        trained_tokens=fine_tune.trained_tokens,
        error=error,
        seed=fine_tune.seed,
        estimated_finish=_unix(estimate.finish_at),
        suffix=fine_tune.suffix,
        job_id=job.id,
        lora=fine_tune.lora,
        gpu_product=job.gpu_product,
        gpus=job.gpus_per_node,
        progress=ProgressOut(
            step=fine_tune.step, total_steps=fine_tune.total_steps, percent=estimate.percent
        ),
        cost=CostOut(so_far=estimate.cost_so_far, expected_total=estimate.expected_total),
        reason=english(fine_tunes.reason(fine_tune, job)),
    )


@router.post("", response_model=FineTuningJobOut, responses=WITH_BODY | errors(402, 403, 404))
def create(body: FineTuneRequest, user: CurrentUser, ctx: Ctx) -> FineTuningJobOut:
    """A fine-tune of ``model`` on the caller's files; 4xx answers name the field that is wrong."""
    with ctx.db.session() as session:
        fine_tune, job = fine_tunes.create(ctx, session, owner=session.merge(user), request=body)
        return job_out(session, fine_tune, job)


@router.get("", response_model=FineTuningJobListOut, responses=NOT_FOUND)
def list_jobs(
    user: CurrentUser,
    ctx: Ctx,
    after: After = None,
    limit: Limit = 20,
    all: Annotated[bool, Query(description="admins: every user's fine-tunes")] = False,
) -> FineTuningJobListOut:
    with ctx.db.session() as session:
        page = fine_tunes.list_for(session, user, after=after, limit=limit, everyone=all)
        found = fine_tune_estimate.estimates(session, page.items)
        data = [_out(ft, job, estimate) for (ft, job), estimate in zip(page.items, found, strict=True)]
        return FineTuningJobListOut(data=data, has_more=page.has_more)


@router.get("/{fine_tune_id}", response_model=FineTuningJobOut, responses=NOT_FOUND)
def get_job(fine_tune_id: str, user: CurrentUser, ctx: Ctx) -> FineTuningJobOut:
    with ctx.db.session() as session:
        fine_tune, job = fine_tunes.get(session, user, fine_tune_id)
        return job_out(session, fine_tune, job)


@router.post("/{fine_tune_id}/cancel", response_model=FineTuningJobOut, responses=errors(404, 409))
def cancel(fine_tune_id: str, user: CurrentUser, ctx: Ctx) -> FineTuningJobOut:
    """A queued fine-tune ends at once; a running one is stopped by its agent."""
    with ctx.db.session() as session:
        fine_tune, job = fine_tunes.cancel(session, session.merge(user), fine_tune_id)
        return job_out(session, fine_tune, job)


@router.get("/{fine_tune_id}/events", response_model=FineTuningEventListOut, responses=NOT_FOUND)
def list_events(
    fine_tune_id: str, user: CurrentUser, ctx: Ctx, after: After = None, limit: Limit = 20
) -> FineTuningEventListOut:
    with ctx.db.session() as session:
        fine_tune, _ = fine_tunes.get(session, user, fine_tune_id)
        page = fine_tunes.events(session, fine_tune, after=after, limit=limit)
        data = [
            FineTuningEventOut(
                id=fine_tunes.event_id(e),
                created_at=_unix(e.at) or 0,
                level=e.level,
                message=english(e.message) or "",
                type=e.type,
                data=e.data,
            )
            for e in page.items
        ]
        return FineTuningEventListOut(data=data, has_more=page.has_more)


@router.get("/{fine_tune_id}/checkpoints", response_model=FineTuningCheckpointListOut, responses=NOT_FOUND)
def list_checkpoints(
    fine_tune_id: str, user: CurrentUser, ctx: Ctx, after: After = None, limit: Limit = 10
) -> FineTuningCheckpointListOut:
    with ctx.db.session() as session:
        fine_tune, _ = fine_tunes.get(session, user, fine_tune_id)
        page = fine_tunes.checkpoints(session, fine_tune, after=after, limit=limit)
        data = [_checkpoint_out(fine_tune, c) for c in page.items]
        return FineTuningCheckpointListOut(
            data=data,
            has_more=page.has_more,
            first_id=data[0].id if data else None,
            last_id=data[-1].id if data else None,
        )


def _checkpoint_out(fine_tune: FineTune, checkpoint: FineTuneCheckpoint) -> FineTuningCheckpointOut:
    name = fine_tune.fine_tuned_model or model_name(fine_tune.model_name, fine_tune.suffix, fine_tune.id)
    return FineTuningCheckpointOut(
        id=checkpoint.id,
        created_at=_unix(checkpoint.created_at) or 0,
        fine_tuned_model_checkpoint=f"{name}:ckpt-step-{checkpoint.step}",
        step_number=checkpoint.step,
        metrics=CheckpointMetricsOut.model_validate(checkpoint.metrics | {"step": checkpoint.step}),
        fine_tuning_job_id=fine_tune.id,
    )
