"""Fine-tunes as their users see them (docs/finetune.md): create one (its files and model checked,
its cost estimated against the cap), list, look, cancel, its events and checkpoints. A fine-tune
is an ordinary job underneath, submitted through jobs.submit, so it is scheduled, fenced, logged and
billed as every job is."""

from __future__ import annotations

import enum
import secrets
from dataclasses import dataclass
from typing import Generic, TypeVar

from sqlalchemy import select, tuple_
from sqlalchemy.orm import Session

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.finetune_models import (
    CatalogModel,
    DataFile,
    FileStatus,
    FineTune,
    FineTuneCheckpoint,
    FineTuneEvent,
    ModelKind,
)
from sxwl.cloud.db.json_rows import StoredAt, StoredInput, stored_input
from sxwl.cloud.db.models import TERMINAL_STATES, Job, JobState, Role, User
from sxwl.cloud.errors import AppError, invalid
from sxwl.cloud.services.catalog import model_catalog
from sxwl.cloud.services.finetune import fine_tune_estimate, fine_tune_events
from sxwl.cloud.services.finetune.fine_tune_kind import FINE_TUNE
from sxwl.cloud.services.jobs import jobs
from sxwl.cloud.services.jobs.job_kinds import Workload
from sxwl.protocol.finetune import FineTuneRequest, JobInput, TrainerSpec
from sxwl.protocol.jobs import MAX_NAME, JobIn
from sxwl.protocol.reasons import Reason

T = TypeVar("T")
TRAINER_COMMAND = ["sxwl-trainer"]
# Where the artifact store keeps uploaded files (docs/finetune.md): a reserved job id.
FILES_JOB = "files"


class Status(enum.StrEnum):
    VALIDATING_FILES = "validating_files"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


_BY_JOB_STATE = {
    JobState.QUEUED: Status.QUEUED,
    JobState.ASSIGNED: Status.QUEUED,
    JobState.LOST: Status.QUEUED,
    JobState.STARTING: Status.RUNNING,
    JobState.RUNNING: Status.RUNNING,
    JobState.FAILED: Status.FAILED,
    JobState.CANCELLED: Status.CANCELLED,
}


def status(fine_tune: FineTune, job: Job) -> Status:
    """Files are validated when they are uploaded, so a fine-tune never stays validating_files; it
    has succeeded only once its adapter is registered."""
    if job.state == JobState.SUCCEEDED:
        return Status.SUCCEEDED if fine_tune.fine_tuned_model else Status.FAILED
    return _BY_JOB_STATE[job.state]


def reason(fine_tune: FineTune, job: Job) -> Reason | None:
    """Why the fine-tune is in its status, where that needs saying: what a queued one waits for (its
    job's reason, in the scheduler's words), or why it failed or was cancelled."""
    if status(fine_tune, job) in (Status.QUEUED, Status.FAILED, Status.CANCELLED):
        return job.reason
    return None


def _not_found(field: str, message: str) -> AppError:
    return AppError(404, f"{field}: {message}", details=[{"field": field, "message": message}])


def _model(session: Session, owner: User, name: str) -> CatalogModel:
    model = model_catalog.find(session, owner, name)
    if model is None:
        raise _not_found("model", f"no model {name}; GET /v1/models lists those you may fine-tune")
    if model.kind != ModelKind.BASE:
        base = f" (fine-tune its base model {model.base.name})" if model.base else ""
        raise invalid("model", f"{name} is a fine-tuned adapter, not a base model{base}")
    return model


def _file(session: Session, owner: User, field: str, file_id: str) -> DataFile:
    found = session.get(DataFile, file_id)
    if found is None or found.owner_id != owner.id:
        raise _not_found(field, f"no file {file_id}")
    if found.status != FileStatus.PROCESSED:
        raise invalid(field, f"file {file_id} has errors; fix them and upload it again")
    if not found.examples:
        raise invalid(field, f"file {file_id} holds no examples")
    return found


def _input(name: str, *, sha256: str, size: int, address: StoredAt, archive: bool = False) -> StoredInput:
    entry = JobInput.model_validate({"name": name, "sha256": sha256, "size": size, "archive": archive})
    return stored_input(entry, address)


def _file_input(name: str, file: DataFile) -> StoredInput:
    address = StoredAt(job_id=FILES_JOB, attempt=0, path=file.id)
    return _input(name, sha256=file.sha256, size=file.bytes, address=address)


def create(
    ctx: CloudContext, session: Session, *, owner: User, request: FineTuneRequest
) -> tuple[FineTune, Job]:
    """Everything is checked before anything is written: a refused request leaves no row behind."""
    model = _model(session, owner, request.model)
    training = _file(session, owner, "training_file", request.training_file)
    validation = (
        _file(session, owner, "validation_file", request.validation_file) if request.validation_file else None
    )
    hyper = request.hyperparameters.resolved()
    seed = request.seed if request.seed is not None else secrets.randbelow(2**31)
    spec = JobIn(
        name=f"ft-{request.suffix or request.model}"[:MAX_NAME],
        command=TRAINER_COMMAND,
        gpu_product=request.gpu_product,
        gpus_per_node=request.gpus,
    )
    if request.max_cost is not None:
        steps = fine_tune_estimate.planned_steps(training.examples, hyper.batch_size, hyper.n_epochs)
        guess = fine_tune_estimate.guessed_cost(session, spec, steps)
        # The refusal's numbers go with its words, so that the console says it in its own.
        if guess is None:
            no_price = "no price is set for these GPUs yet, so the cost cannot be estimated"
            raise AppError(
                422,
                f"max_cost: {no_price}",
                details=[{"field": "max_cost", "message": no_price, "code": "no_price"}],
            )
        if guess > request.max_cost:
            over = (
                f"the estimated cost ({guess} micro-yuan for about {steps} steps) is above the cap "
                f"({request.max_cost}); raise it or train less"
            )
            detail = {
                "field": "max_cost",
                "message": over,
                "cost": guess,
                "steps": steps,
                "cap": request.max_cost,
            }
            raise AppError(422, f"max_cost: {over}", details=[detail])
    trainer = TrainerSpec(hyperparameters=hyper, lora=request.lora, seed=seed)
    workload = Workload(
        FINE_TUNE,
        trainer=trainer.model_dump(mode="json"),
        inputs=[
            _input("model", sha256=model.sha256, size=model.bytes, address=model.object, archive=True),
            _file_input("training_file", training),
            *([_file_input("validation_file", validation)] if validation else []),
        ],
    )
    job = jobs.submit(ctx, session, owner, spec, workload)  # refuses (402) a balance that cannot pay
    fine_tune = FineTune(
        id=f"ftjob-{secrets.token_hex(12)}",
        owner_id=owner.id,
        job_id=job.id,
        model=model.id,
        model_name=model.name,
        training_file=training.id,
        validation_file=validation.id if validation else None,
        hyperparameters=hyper.model_dump(),
        lora=request.lora.model_dump(mode="json"),
        suffix=request.suffix,
        seed=seed,
        max_cost=request.max_cost,
    )
    session.add(fine_tune)
    session.flush()
    fine_tune_events.add(session, fine_tune, Reason.of("ft.validating_training", file=training.id))
    if validation is not None:
        fine_tune_events.add(session, fine_tune, Reason.of("ft.validating_validation", file=validation.id))
    fine_tune_events.add(session, fine_tune, Reason.of("ft.files_validated"))
    fine_tune_events.add(session, fine_tune, Reason.of("ft.created", id=fine_tune.id))
    fine_tune_events.add(session, fine_tune, Reason.of("ft.queued"))
    return fine_tune, job


def get(session: Session, user: User, fine_tune_id: str) -> tuple[FineTune, Job]:
    """Another user's fine-tune is as absent as one that does not exist (404), as OpenAI answers;
    administrators see every fine-tune, as they see every job."""
    fine_tune = session.get(FineTune, fine_tune_id)
    if fine_tune is None or (fine_tune.owner_id != user.id and user.role != Role.ADMIN):
        raise AppError(404, f"no fine-tuning job {fine_tune_id}")
    job = session.get(Job, fine_tune.job_id)
    assert job is not None  # the fine-tune is deleted with its job
    return fine_tune, job


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    has_more: bool


def list_for(
    session: Session, user: User, *, after: str | None, limit: int, everyone: bool = False
) -> Page[tuple[FineTune, Job]]:
    """Newest first; ``after``: the last id of the previous page; ``everyone``: every user's, for
    an administrator (ignored for anyone else)."""
    stmt = select(FineTune, Job).join(Job, Job.id == FineTune.job_id)
    if not (everyone and user.role == Role.ADMIN):
        stmt = stmt.where(FineTune.owner_id == user.id)
    if after is not None:
        mark, _ = get(session, user, after)
        stmt = stmt.where(tuple_(FineTune.created_at, FineTune.id) < tuple_(mark.created_at, mark.id))
    rows = session.execute(stmt.order_by(FineTune.created_at.desc(), FineTune.id.desc()).limit(limit + 1))
    found = [(ft, job) for ft, job in rows]
    return Page(found[:limit], len(found) > limit)


def cancel(session: Session, user: User, fine_tune_id: str) -> tuple[FineTune, Job]:
    fine_tune, job = get(session, user, fine_tune_id)
    if job.state in TERMINAL_STATES:
        raise jobs.finished(status(fine_tune, job).value, "fine-tune")
    job = jobs.cancel(session, user, fine_tune.job_id)
    return fine_tune, job


EVENT_PREFIX = "ftevent-"


def event_id(event: FineTuneEvent) -> str:
    return f"{EVENT_PREFIX}{event.id}"


def events(session: Session, fine_tune: FineTune, *, after: str | None, limit: int) -> Page[FineTuneEvent]:
    """Newest first, as OpenAI lists them; ``after``: the last event id of the previous page."""
    stmt = select(FineTuneEvent).where(FineTuneEvent.fine_tune_id == fine_tune.id)
    if after is not None:
        number = after.removeprefix(EVENT_PREFIX)
        if not number.isascii() or not number.isdigit() or len(number) > 18:
            raise invalid("after", f"not an event id ({EVENT_PREFIX}<number>)")
        stmt = stmt.where(FineTuneEvent.id < int(number))
    found = list(session.scalars(stmt.order_by(FineTuneEvent.id.desc()).limit(limit + 1)))
    return Page(found[:limit], len(found) > limit)


def checkpoints(
    session: Session, fine_tune: FineTune, *, after: str | None, limit: int
) -> Page[FineTuneCheckpoint]:
    """Newest (highest step) first; ``after``: the last checkpoint id of the previous page."""
    stmt = select(FineTuneCheckpoint).where(FineTuneCheckpoint.fine_tune_id == fine_tune.id)
    if after is not None:
        mark = session.get(FineTuneCheckpoint, after)
        if mark is None or mark.fine_tune_id != fine_tune.id:
            raise invalid("after", f"no checkpoint {after} of this fine-tuning job")
        stmt = stmt.where(tuple_(FineTuneCheckpoint.step, FineTuneCheckpoint.id) < tuple_(mark.step, mark.id))
    order = (FineTuneCheckpoint.step.desc(), FineTuneCheckpoint.id.desc())
    found = list(session.scalars(stmt.order_by(*order).limit(limit + 1)))
    return Page(found[:limit], len(found) > limit)
