"""Read-only view models of the console's job pages, and the submit form's parsing.

Submitting and cancelling go through ``sxwl.cloud.services.jobs.jobs``; the form is validated by the
API's own ``JobIn`` model (``sxwl.protocol.jobs``, with the limits it shares with the CLI), and this
module only turns its errors into the console's words."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import quote

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sxwl.cloud.db.models import TERMINAL_STATES, Artifact, Job, JobEvent, JobState, Role, User
from sxwl.cloud.errors import AppError
from sxwl.cloud.services.catalog import storage_quota
from sxwl.cloud.services.jobs import job_events, jobs
from sxwl.cloud.services.money.gpu_summary import GpuSummary
from sxwl.cloud.web.i18n import translate
from sxwl.cloud.web.i18n.reasons import reason_text
from sxwl.protocol.fields import CONTROL_CHARS
from sxwl.protocol.jobs import (
    MAX_ENV,
    MAX_ENV_VALUE,
    MAX_GPUS_PER_NODE,
    MAX_NODES,
    MAX_RUNTIME_S,
    JobIn,
    env_problem,
)
from sxwl.protocol.reasons import Reason

PER_PAGE = 20
STATES = [s.value for s in JobState]
# The list's tabs: which states each one shows (None: all of them).
VIEWS: dict[str, frozenset[JobState] | None] = {
    "all": None,
    "active": frozenset({JobState.ASSIGNED, JobState.STARTING, JobState.RUNNING, JobState.LOST}),
    "queued": frozenset({JobState.QUEUED}),
    "finished": frozenset(TERMINAL_STATES),
}
# The form takes the max runtime in minutes.
MAX_RUNTIME_MIN = MAX_RUNTIME_S // 60


# ---- words ----------------------------------------------------------------------------------


def state_name(lang: str, state: str) -> str:
    key = f"job.state.{state}"
    text = translate(lang, key)
    return state if text == key else text


def duration(lang: str, seconds: int | None) -> str:
    """``1 h 5 min`` / ``1 小时 5 分``: two units at most, for people."""
    if seconds is None:
        return "—"
    seconds = max(int(seconds), 0)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")]
    first = next((i for i, (n, _) in enumerate(parts) if n), len(parts) - 1)
    # The biggest unit and the one after it (if not zero): "2 h 3 min", "5 min 10 s", "12 s".
    picked = [parts[first]]
    if first + 1 < len(parts) and parts[first + 1][0]:
        picked.append(parts[first + 1])
    return " ".join(translate(lang, f"duration.{unit}", n=n) for n, unit in picked)


size = storage_quota.size_text


def reason(lang: str, said: Reason | None) -> str:
    """A reason or an event's detail in the console's language, from its code (web/i18n/reasons.py)."""
    return reason_text(lang, said)


def event_name(lang: str, kind: str) -> str:
    key = f"job.event.{kind}"
    text = translate(lang, key)
    return kind if text == key else text


def gpus_text(lang: str, job: Job) -> str:
    if job.gpus_per_node == 0:
        return translate(lang, "job.cpu_only")
    product = job.gpu_product or translate(lang, "job.any_product")
    return f"{job.nodes}×{job.gpus_per_node} {product}"


def command_text(command: Any) -> str:
    if isinstance(command, str):
        return command
    return " ".join(quote_arg(str(a)) for a in command)


def quote_arg(arg: str) -> str:
    if arg and re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]+", arg):
        return arg
    return "'" + arg.replace("'", "'\"'\"'") + "'"


def artifact_url(job_id: str, path: str) -> str:
    return f"/api/v1/jobs/{job_id}/artifacts/{quote(path, safe='/')}"


# ---- the list -------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobRow:
    id: str
    name: str
    owner_email: str
    state: str
    gpus: str
    gpu_title: str
    created_at: datetime
    duration_s: int | None
    queue_position: int | None
    reason: str
    exit_code: int | None

    @property
    def short_id(self) -> str:
        return self.id[:8]

    @property
    def version(self) -> str:
        """Changes whenever the row's text does, so the live list swaps the row."""
        return f"{self.state}:{self.queue_position}:{self.reason}:{self.exit_code}"


@dataclass(frozen=True)
class JobList:
    rows: list[JobRow]
    total: int
    page: int
    pages: int
    counts: dict[str, int]  # per tab, over every job the list may show
    any_jobs: bool


def elapsed(job: Job, now: datetime) -> int | None:
    if job.started_at is None:
        return None
    end = job.finished_at or now
    return max(int((end - job.started_at).total_seconds()), 0)


def job_row(lang: str, job: Job, now: datetime, queue_position: int | None) -> JobRow:
    return JobRow(
        id=job.id,
        name=job.name,
        owner_email=job.owner.email,
        state=job.state.value,
        gpus=gpus_text(lang, job),
        gpu_title=translate(lang, "job.gpus_title", nodes=job.nodes, gpus=job.gpus_per_node),
        created_at=job.created_at,
        duration_s=elapsed(job, now),
        queue_position=queue_position,
        reason=reason(lang, job.reason),
        exit_code=job.exit_code,
    )


def tab_counts(session: Session, user: User, everyone: bool) -> dict[str, int]:
    stmt = select(Job.state, func.count()).group_by(Job.state)
    if not (everyone and user.role == Role.ADMIN):
        stmt = stmt.where(Job.owner_id == user.id)
    by_state: dict[JobState, int] = {state: int(n) for state, n in session.execute(stmt).all()}
    return {
        view: sum(n for s, n in by_state.items() if states is None or s in states)
        for view, states in VIEWS.items()
    }


def job_list(
    session: Session, user: User, lang: str, now: datetime, view: str, query: str, page: int, everyone: bool
) -> JobList:
    states = VIEWS.get(view)
    counts = tab_counts(session, user, everyone)
    result = jobs.list_for(
        session, user, page, PER_PAGE, sorted(states) if states else None, query, everyone=everyone
    )
    pages = max((result.total + PER_PAGE - 1) // PER_PAGE, 1)
    positions = jobs.queue_positions(session, result.items)
    rows = [job_row(lang, job, now, positions.get(job.id)) for job in result.items]
    return JobList(rows, result.total, page, pages, counts, counts["all"] > 0)


# ---- one job --------------------------------------------------------------------------------


@dataclass(frozen=True)
class EventRow:
    at: datetime
    attempt: int
    kind: str
    name: str
    detail: str


@dataclass(frozen=True)
class ArtifactRow:
    path: str
    size: str
    bytes: int
    url: str
    attempt: int


@dataclass(frozen=True)
class JobDetail:
    row: JobRow
    job: Job
    command: str
    env: list[tuple[str, str]]
    attempt: int
    max_attempts: int
    terminal: bool
    cancellable: bool
    cancel_requested: bool
    events: list[EventRow] = field(default_factory=list)
    artifacts: list[ArtifactRow] = field(default_factory=list)

    @property
    def version(self) -> str:
        return f"{self.row.version}:{self.attempt}:{len(self.events)}:{len(self.artifacts)}"


def _events(lang: str, rows: list[JobEvent]) -> list[EventRow]:
    return [EventRow(e.at, e.attempt, e.kind, event_name(lang, e.kind), reason(lang, e.detail)) for e in rows]


def _artifacts(job_id: str, rows: list[Artifact]) -> list[ArtifactRow]:
    return [ArtifactRow(a.path, size(a.size), a.size, artifact_url(job_id, a.path), a.attempt) for a in rows]


def job_detail(session: Session, user: User, lang: str, job_id: str, now: datetime) -> JobDetail:
    """The job as ``user`` may see it; AppError 404 / 403 otherwise."""
    job = jobs.get_for(session, user, job_id)
    terminal = job.state in TERMINAL_STATES
    return JobDetail(
        row=job_row(lang, job, now, jobs.queue_positions(session, [job]).get(job.id)),
        job=job,
        command=command_text(job.command),
        env=sorted((job.env or {}).items()),
        attempt=job.attempt,
        max_attempts=job.max_attempts,
        terminal=terminal,
        cancellable=not terminal and job.cancel_requested_at is None,
        cancel_requested=job.cancel_requested_at is not None and not terminal,
        events=_events(lang, job_events.events(session, job)),
        artifacts=_artifacts(job.id, jobs.artifacts(session, job)),
    )


# ---- the submit form ------------------------------------------------------------------------

FORM_FIELDS = (
    "name",
    "command",
    "image",
    "env",
    "gpu_product",
    "gpus_per_node",
    "nodes",
    "max_runtime_min",
    "cpod_id",
)
FORM_DEFAULTS = {"nodes": "1"}


def form_defaults(gpu_types: Sequence[GpuSummary]) -> dict[str, str]:
    """What the submit form starts with, so that submitting it untouched asks for what can run: 1 GPU
    where an online CPod has GPUs, else 0 (a GPU asked for would keep the job queued for ever)."""
    return FORM_DEFAULTS | {"gpus_per_node": "1" if any(g.total for g in gpu_types) else "0"}


# JobIn's field -> the form's field, where they differ.
_FORM_FIELD = {"max_runtime_s": "max_runtime_min"}


@dataclass
class EnvParse:
    values: dict[str, str]
    lines: dict[str, int]  # variable -> its line number (1-based)
    error: str | None = None  # the first problem, naming its line


def parse_env(lang: str, text: str) -> EnvParse:
    """``KEY=VALUE`` per line; blank lines and ``#`` comments are skipped. Syntax problems are found
    here (the model sees a dict); the names themselves are JobIn's to judge."""
    result = EnvParse({}, {})
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not key:
            problem = translate(lang, "job.env.no_equals" if not sep else "job.env.no_name")
        elif key in result.values:
            problem = translate(lang, "job.env.duplicate", var=key, first=result.lines[key])
        else:
            result.values[key] = value.strip()
            result.lines[key] = number
            continue
        if result.error is None:
            result.error = translate(lang, "job.env.line", line=number, problem=problem)
    return result


def _env_problem(lang: str, env: EnvParse, fallback: str) -> str:
    """Which line JobIn refused, and why, in the console's words."""
    if len(env.values) > MAX_ENV:
        return translate(lang, "job.env.too_many", n=MAX_ENV)
    for key, value in env.values.items():
        if found := env_problem(key, value):
            # str.format ignores the count where a message has no place for it.
            problem = translate(lang, f"job.env.{found[0]}", var=key, n=MAX_ENV_VALUE)
            return translate(lang, "job.env.line", line=env.lines[key], problem=problem)
    return fallback


def job_payload(form: Mapping[str, str], env: EnvParse) -> dict[str, Any]:
    """The form as the JSON body the API takes: blank optional fields left out, minutes as seconds."""
    payload: dict[str, Any] = {
        "command": form.get("command", "").replace("\r\n", "\n"),
        "env": env.values,
        "gpus_per_node": form.get("gpus_per_node", "").strip(),
        "nodes": form.get("nodes", "").strip(),
    }
    for name in ("name", "image", "gpu_product", "cpod_id"):
        if value := form.get(name, "").strip():
            payload[name] = value
    minutes = form.get("max_runtime_min", "").strip()
    if minutes:
        try:
            payload["max_runtime_s"] = int(minutes) * 60
        except ValueError:
            payload["max_runtime_s"] = minutes  # JobIn says it is not a whole number
    return payload


def _message(lang: str, field_name: str, kind: str, raw: str) -> str:
    if field_name == "command":
        return translate(lang, "job.error.command_long" if "longer" in raw else "job.error.command")
    if field_name == "gpus_per_node":
        return translate(lang, "job.error.range", low=0, high=MAX_GPUS_PER_NODE)
    if field_name == "nodes":
        return translate(lang, "job.error.range", low=1, high=MAX_NODES)
    if field_name == "max_runtime_min":
        return translate(lang, "job.error.max_runtime", high=MAX_RUNTIME_MIN)
    if field_name == "cpod_id":
        return translate(lang, "job.error.cpod")
    if kind == "string_too_long":
        return translate(lang, "error.too_long")
    if CONTROL_CHARS in raw:
        return translate(lang, "error.control_chars")
    if kind in ("missing", "string_too_short"):
        return translate(lang, "error.required")
    return raw


def validate_form(lang: str, form: Mapping[str, str]) -> tuple[JobIn | None, dict[str, str]]:
    """The form through JobIn: the model, or messages per form field (and nothing is submitted)."""
    env = parse_env(lang, form.get("env", ""))
    errors: dict[str, str] = {}
    if env.error:
        errors["env"] = env.error
    try:
        body = JobIn.model_validate(job_payload(form, env), strict=False)
    except ValidationError as exc:
        for error in exc.errors():
            loc = [str(p) for p in error["loc"]]
            name = _FORM_FIELD.get(loc[0], loc[0]) if loc else "form"
            if name == "env":
                errors.setdefault("env", _env_problem(lang, env, error["msg"]))
            else:
                errors.setdefault(name, _message(lang, name, error["type"], error["msg"]))
        return None, errors
    return (None, errors) if errors else (body, {})


def submit_errors(lang: str, exc: AppError) -> dict[str, str]:
    """A 422 from the jobs service (an unknown CPod, say) as form-field messages."""
    errors: dict[str, str] = {}
    for detail in exc.details or []:
        name = _FORM_FIELD.get(detail.get("field", ""), detail.get("field", "form"))
        errors.setdefault(name, _message(lang, name, "", detail.get("message", exc.message)))
    return errors or {"form": exc.message}
