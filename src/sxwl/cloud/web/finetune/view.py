"""Read-only view models of the console's fine-tuning pages (微调): the list, the files, one
fine-tune with its progress, events, checkpoints and loss chart (finetune_chart.py). Creating and
cancelling go through ``sxwl.cloud.services.finetune.fine_tunes``; the form is finetune_form.py's."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any
from urllib.parse import quote

from sqlalchemy import select
from sqlalchemy.orm import Session

from sxwl.cloud.db.finetune_models import (
    CatalogModel,
    DataFile,
    FileStatus,
    FineTune,
    FineTuneCheckpoint,
    FineTuneEvent,
    ModelKind,
)
from sxwl.cloud.db.models import TERMINAL_STATES, Job, Role, User
from sxwl.cloud.services.catalog import model_catalog
from sxwl.cloud.services.finetune import datasets, fine_tune_estimate, fine_tunes
from sxwl.cloud.services.finetune.dataset_checks import Problem
from sxwl.cloud.web.finetune.chart import Chart, loss_chart
from sxwl.cloud.web.i18n import translate
from sxwl.cloud.web.i18n.reasons import reason_text
from sxwl.cloud.web.jobs.view import size
from sxwl.protocol.reasons import Reason

LIST_LIMIT = 50
FILES_LIMIT = 100
EVENTS_SHOWN = 40
CHECKPOINTS_SHOWN = 20
# The chart reads at most this many metrics events (the latest).
CHART_EVENTS = 5000
STATUSES = [s.value for s in fine_tunes.Status]


# ---- words ----------------------------------------------------------------------------------


def status_name(lang: str, status: str) -> str:
    key = f"ft.status.{status}"
    text = translate(lang, key)
    return status if text == key else text


def problem_text(lang: str, said: Reason) -> str:
    """A dataset line's problem in the console's language, from its code (web/i18n/reasons.py)."""
    return reason_text(lang, said)


def event_text(lang: str, message: Reason) -> str:
    """An event's message in the console's language, from its code (web/i18n/reasons.py)."""
    return reason_text(lang, message)


def params_text(parameters: int | None) -> str:
    if not parameters:
        return ""
    for unit, scale in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if parameters >= scale:
            return f"{parameters / scale:.1f}".rstrip("0").rstrip(".") + unit
    return str(parameters)


def model_url(model_id: str) -> str:
    """The adapter's download (the API's; a console session may use it, as for job artifacts)."""
    return f"/api/v1/models/{quote(model_id, safe=':')}/content"


# ---- the list -------------------------------------------------------------------------------


@dataclass(frozen=True)
class FineTuneRow:
    id: str
    name: str
    model: str
    status: str
    step: int
    total_steps: int
    percent: float | None
    finish_at: datetime | None
    cost_so_far: int
    expected_total: int | None
    created_at: datetime
    fine_tuned_model: str | None
    cancel_requested: bool
    reason: Reason | None = None  # what a queued one waits for, or why it failed or was cancelled
    owner_email: str | None = None  # shown when an administrator lists every user's

    @property
    def percent_text(self) -> str:
        return f"{self.percent:.0f}%" if self.percent is not None else ""

    @property
    def version(self) -> str:
        """Changes whenever the row's text does, so the live list swaps the row."""
        return (
            f"{self.status}:{self.step}:{self.total_steps}:{self.cost_so_far}:{self.fine_tuned_model}"
            f":{self.reason.stored if self.reason else ''}"
        )


def row_of(session: Session, fine_tune: FineTune, job: Job, now: datetime) -> FineTuneRow:
    return _row(fine_tune, job, fine_tune_estimate.estimate(session, fine_tune, job, now))


def _row(fine_tune: FineTune, job: Job, estimate: fine_tune_estimate.Estimate) -> FineTuneRow:
    return FineTuneRow(
        id=fine_tune.id,
        name=fine_tune.suffix or fine_tune.model_name,
        model=fine_tune.model_name,
        status=fine_tunes.status(fine_tune, job).value,
        step=fine_tune.step,
        total_steps=fine_tune.total_steps,
        percent=estimate.percent,
        finish_at=estimate.finish_at,
        cost_so_far=estimate.cost_so_far,
        expected_total=estimate.expected_total,
        created_at=fine_tune.created_at,
        fine_tuned_model=fine_tune.fine_tuned_model,
        cancel_requested=job.cancel_requested_at is not None and job.state not in TERMINAL_STATES,
        reason=fine_tunes.reason(fine_tune, job),
    )


@dataclass(frozen=True)
class FineTuneList:
    rows: list[FineTuneRow]
    has_more: bool
    has_files: bool  # a processed file to train on: the empty state's next step


def fine_tune_list(
    session: Session, user: User, now: datetime, after: str | None, *, everyone: bool = False
) -> FineTuneList:
    """A page of the caller's fine-tunes; ``everyone``: every user's, with their emails, for an
    administrator (ignored for anyone else, as in ``fine_tunes.list_for``)."""
    page = fine_tunes.list_for(session, user, after=after, limit=LIST_LIMIT, everyone=everyone)
    found = fine_tune_estimate.estimates(session, page.items, now)
    rows = [_row(ft, job, estimate) for (ft, job), estimate in zip(page.items, found, strict=True)]
    if everyone and user.role == Role.ADMIN:
        owners = {ft.owner_id for ft, _ in page.items}
        emails: dict[str, str] = dict(
            session.execute(select(User.id, User.email).where(User.id.in_(owners))).all()
        )
        rows = [
            replace(row, owner_email=emails.get(ft.owner_id))
            for row, (ft, _) in zip(rows, page.items, strict=True)
        ]
    has_files = bool(training_files(session, user)) if not rows else True
    return FineTuneList(rows, page.has_more, has_files)


# ---- files ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileRow:
    id: str
    filename: str
    status: str
    format: str | None
    examples: int
    size: str
    bytes: int
    created_at: datetime
    problems: list[tuple[int, Reason]]
    problem_count: int
    tokens: list[tuple[str, int]]  # (base model, tokens), once a fine-tune of that base counted them

    @property
    def usable(self) -> bool:
        return self.status == FileStatus.PROCESSED.value and self.examples > 0


def file_row(file: DataFile) -> FileRow:
    problems = [(p.line, p.said) for p in map(Problem.of, file.problems or [])]
    return FileRow(
        id=file.id,
        filename=file.filename,
        status=file.status.value,
        format=file.format,
        examples=file.examples,
        size=size(file.bytes),
        bytes=file.bytes,
        created_at=file.created_at,
        problems=problems,
        problem_count=max(file.problem_count, len(problems)),
        tokens=sorted((model, int(c.get("tokens", 0))) for model, c in (file.token_counts or {}).items()),
    )


def file_rows(session: Session, user: User) -> list[FileRow]:
    rows, _ = datasets.list_for(session, owner_id=user.id, after=None, limit=FILES_LIMIT)
    return [file_row(f) for f in rows]


def training_files(session: Session, user: User) -> list[FileRow]:
    return [r for r in file_rows(session, user) if r.usable]


def last_model(session: Session, user: User) -> str | None:
    """The name of the base model of the user's latest fine-tune: the new fine-tune form's first
    choice (the form names models as the user does)."""
    return session.scalar(
        select(FineTune.model_name)
        .where(FineTune.owner_id == user.id)
        .order_by(FineTune.created_at.desc(), FineTune.id.desc())
        .limit(1)
    )


def base_models(session: Session, user: User) -> list[CatalogModel]:
    """What may be fine-tuned: the visible base models (an adapter is refused as a base)."""
    return [m for m in model_catalog.visible(session, user=user) if m.kind == ModelKind.BASE]


# ---- one fine-tune ----------------------------------------------------------------------------


@dataclass(frozen=True)
class EventRow:
    at: datetime
    level: str
    type: str
    message: str


@dataclass(frozen=True)
class CheckpointRow:
    id: str
    step: int
    attempt: int
    path: str
    train_loss: float | None
    valid_loss: float | None
    created_at: datetime


def _series(session: Session, fine_tune: FineTune) -> list[tuple[int, float | None, float | None]]:
    rows = session.scalars(
        select(FineTuneEvent.data)
        .where(FineTuneEvent.fine_tune_id == fine_tune.id, FineTuneEvent.type == "metrics")
        .order_by(FineTuneEvent.id.desc())
        .limit(CHART_EVENTS)
    ).all()
    series: list[tuple[int, float | None, float | None]] = []
    for data in reversed(rows):
        if not isinstance(data, dict) or not isinstance(data.get("step"), int):
            continue
        series.append((data["step"], _number(data.get("loss")), _number(data.get("eval_loss"))))
    return series


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class FineTuneDetail:
    row: FineTuneRow
    fine_tune: FineTune
    job: Job
    terminal: bool
    cancellable: bool
    training_filename: str
    validation_filename: str | None
    chart: Chart
    events: list[EventRow] = field(default_factory=list)
    checkpoints: list[CheckpointRow] = field(default_factory=list)

    @property
    def adapter_url(self) -> str | None:
        return model_url(self.row.fine_tuned_model) if self.row.fine_tuned_model else None


def _filename(session: Session, file_id: str | None) -> str | None:
    if file_id is None:
        return None
    found = session.get(DataFile, file_id)
    return found.filename if found is not None else file_id


def _checkpoint(row: FineTuneCheckpoint) -> CheckpointRow:
    metrics = row.metrics or {}
    return CheckpointRow(
        id=row.id,
        step=row.step,
        attempt=row.attempt,
        path=row.path,
        train_loss=_number(metrics.get("train_loss")),
        valid_loss=_number(metrics.get("valid_loss")),
        created_at=row.created_at,
    )


def fine_tune_detail(
    session: Session, user: User, lang: str, fine_tune_id: str, now: datetime
) -> FineTuneDetail:
    """The fine-tune as ``user`` may see it; AppError 404 otherwise."""
    fine_tune, job = fine_tunes.get(session, user, fine_tune_id)
    terminal = job.state in TERMINAL_STATES
    events = fine_tunes.events(session, fine_tune, after=None, limit=EVENTS_SHOWN).items
    checkpoints = fine_tunes.checkpoints(session, fine_tune, after=None, limit=CHECKPOINTS_SHOWN).items
    return FineTuneDetail(
        row=row_of(session, fine_tune, job, now),
        fine_tune=fine_tune,
        job=job,
        terminal=terminal,
        cancellable=not terminal and job.cancel_requested_at is None,
        training_filename=_filename(session, fine_tune.training_file) or fine_tune.training_file,
        validation_filename=_filename(session, fine_tune.validation_file),
        chart=loss_chart(_series(session, fine_tune), fine_tune.total_steps),
        events=[EventRow(e.at, e.level, e.type, event_text(lang, e.message)) for e in events],
        checkpoints=[_checkpoint(c) for c in checkpoints],
    )
