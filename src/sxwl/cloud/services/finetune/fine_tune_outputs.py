"""What a fine-tune's job leaves behind: checkpoints as they are uploaded (each one becomes the job's
``resume`` input, so a requeued attempt continues from it) and, at the job's end, the adapter,
registered in the model catalogue (docs/finetune.md). Called through the fine-tune kind's hooks
(fine_tune_kind.py), in the transaction of the report or upload."""

from __future__ import annotations

import re
import secrets
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from sxwl.cloud.db.finetune_models import (
    CatalogModel,
    FineTune,
    FineTuneCheckpoint,
    FineTuneEvent,
    ModelKind,
)
from sxwl.cloud.db.json_rows import StoredAt, stored_input
from sxwl.cloud.db.models import Artifact, Job, JobState
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services.finetune import fine_tune_events
from sxwl.protocol.finetune import ADAPTER_ARTIFACT, JobInput, Progress, checkpoint_artifact
from sxwl.protocol.reasons import Reason

_CHECKPOINT = re.compile(r"^checkpoints/step-([0-9]{8,18})\.tar$")
MAX_MODEL_ID = 200


def model_name(base: str, suffix: str | None, fine_tune_id: str) -> str:
    """``ft:<base>:<suffix>:<fine-tune id>``; a base too long for the catalogue's key is shortened."""
    room = MAX_MODEL_ID - len(f"ft:::{suffix or ''}:{fine_tune_id}")
    return f"ft:{base[:room]}:{suffix or ''}:{fine_tune_id}"


def checkpoint_step(path: str) -> int | None:
    match = _CHECKPOINT.match(path)
    if match is None or checkpoint_artifact(int(match.group(1))) != path:
        return None
    return int(match.group(1))


def artifact_recorded(session: Session, job: Job, attempt: int, path: str, size: int, sha256: str) -> None:
    step = checkpoint_step(path)
    if step is None:
        return
    fine_tune = fine_tune_events.of_job(session, job.id)
    if fine_tune is None:
        return
    row = session.scalar(
        select(FineTuneCheckpoint).where(
            FineTuneCheckpoint.fine_tune_id == fine_tune.id,
            FineTuneCheckpoint.attempt == attempt,
            FineTuneCheckpoint.path == path,
        )
    )
    if row is None:
        session.add(
            FineTuneCheckpoint(
                id=f"ftckpt-{secrets.token_hex(12)}",
                fine_tune_id=fine_tune.id,
                attempt=attempt,
                path=path,
                step=step,
                metrics=_logged_at(session, fine_tune.id, attempt, step),
            )
        )
        fine_tune_events.add(session, fine_tune, Reason.of("ft.checkpoint", step=step), attempt=attempt)
    entry = JobInput(name="resume", sha256=sha256, size=size, archive=True)
    resume = stored_input(entry, StoredAt(job_id=job.id, attempt=attempt, path=path))
    # A new list: the JSON column is saved only when it is assigned, not when it is changed in place.
    job.inputs = [entry for entry in job.inputs if entry["name"] != "resume"] + [resume]


def _logged_at(session: Session, fine_tune_id: str, attempt: int, step: int) -> dict[str, Any]:
    """The checkpoint's metrics (OpenAI's names): the losses the attempt logged at its step, from its
    metrics and eval lines (the trainer logs every step it saves at). A line not read yet leaves its
    loss None, and ``steps_logged`` fills it in when it comes."""
    rows = session.scalars(
        select(FineTuneEvent.data).where(
            FineTuneEvent.fine_tune_id == fine_tune_id,
            FineTuneEvent.attempt == attempt,
            FineTuneEvent.type == "metrics",
            FineTuneEvent.data["step"].as_integer() == step,
        )
    ).all()
    metrics: dict[str, Any] = {"step": step, "train_loss": None, "valid_loss": None}
    for data in rows:
        if data and data.get("loss") is not None:
            metrics["train_loss"] = data["loss"]
        if data and data.get("eval_loss") is not None:
            metrics["valid_loss"] = data["eval_loss"]
    return metrics


def steps_logged(session: Session, fine_tune: FineTune, attempt: int, lines: list[Progress]) -> None:
    """The losses of progress lines just read, on the attempt's checkpoints of their steps that
    reached the cloud before them."""
    steps = {p.step for p in lines if p.kind in ("metrics", "eval")}
    if not steps:
        return
    rows = session.scalars(
        select(FineTuneCheckpoint).where(
            FineTuneCheckpoint.fine_tune_id == fine_tune.id,
            FineTuneCheckpoint.attempt == attempt,
            FineTuneCheckpoint.step.in_(steps),
        )
    ).all()
    for row in rows:
        metrics = dict(row.metrics)  # a new dict: the JSON column is saved only when assigned
        for p in lines:
            if p.step == row.step and p.kind == "metrics" and p.loss is not None:
                metrics["train_loss"] = p.loss
            if p.step == row.step and p.eval_loss is not None:
                metrics["valid_loss"] = p.eval_loss
        row.metrics = metrics


def requeued(session: Session, job: Job, attempt: int, why: Reason) -> None:
    fine_tune = fine_tune_events.of_job(session, job.id)
    if fine_tune is None:
        return
    resume = next((entry for entry in job.inputs if entry["name"] == "resume"), None)
    step = checkpoint_step(resume["object"]["path"]) if resume else None
    if step is not None:
        message = Reason.of("ft.requeued_resume", attempt=attempt, why=why, step=step)
    else:
        message = Reason.of("ft.requeued_fresh", attempt=attempt, why=why)
    fine_tune_events.add(session, fine_tune, message, attempt=attempt, level="warn")


def at_end(
    job: Job, session: Session, state: JobState, reason: Reason | None
) -> tuple[JobState, Reason | None]:
    """The fine-tune's part of its job ending in ``state``: on success the adapter is registered, and
    a job that wrote none has failed. Returns the state (and reason) the job ends in."""
    fine_tune = fine_tune_events.of_job(session, job.id)
    if fine_tune is None:
        return state, reason
    fine_tune.finished_at = utcnow()
    if state == JobState.SUCCEEDED:
        adapter = session.scalar(
            select(Artifact).where(Artifact.job_id == job.id, Artifact.path == ADAPTER_ARTIFACT)
        )
        if adapter is None:
            reason = Reason.of("job.no_adapter", path=ADAPTER_ARTIFACT)
            fine_tune_events.add(session, fine_tune, reason, attempt=job.attempt, level="error")
            return JobState.FAILED, reason
        _register(session, fine_tune, adapter)
        fine_tune_events.add(session, fine_tune, Reason.of("ft.succeeded"), attempt=job.attempt)
        return state, reason
    code = "ft.cancelled" if state == JobState.CANCELLED else "ft.failed"
    fine_tune_events.add(
        session,
        fine_tune,
        Reason.of(code, why=reason or Reason.of("ft.no_reason")),
        attempt=job.attempt,
        level="warn" if state == JobState.CANCELLED else "error",
    )
    return state, reason


def _register(session: Session, fine_tune: FineTune, adapter: Artifact) -> None:
    name = model_name(fine_tune.model_name, fine_tune.suffix, fine_tune.id)
    base = session.get(CatalogModel, fine_tune.model)
    address = StoredAt(job_id=adapter.job_id, attempt=adapter.attempt, path=adapter.path)
    model = session.get(CatalogModel, name)  # an adapter's id is its name
    if model is None:
        model = CatalogModel(id=name, name=name, owner_id=fine_tune.owner_id, kind=ModelKind.ADAPTER)
        session.add(model)
    model.base_model_id, model.base = fine_tune.model, base
    model.architecture = base.architecture if base is not None else None
    model.bytes, model.sha256, model.object = adapter.size, adapter.sha256, address
    model.fine_tune_id = fine_tune.id
    fine_tune.fine_tuned_model = name
