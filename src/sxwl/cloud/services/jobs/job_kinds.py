"""Workload kinds: what a kind of work built on jobs (fine-tunes, endpoints; dev environments
next) adds to the life of its jobs. The job state machine (attempts.py, job_logs.py) calls the
kind's hooks in its own transaction and names no kind; a kind registers itself here
(services/__init__.py installs the cloud's kinds) and hands ``jobs.submit`` its ``Workload``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

from sqlalchemy.orm import Session

from sxwl.cloud.db.json_rows import StoredInput
from sxwl.cloud.db.models import AttemptLog, Job, JobState
from sxwl.cloud.kit.security import SecretBox
from sxwl.protocol import Assignment
from sxwl.protocol.reasons import Reason


class Kind(ABC):
    """The hooks of one workload kind, each stated by every kind. Every hook runs inside the unit of
    work of the report, upload or append that caused it."""

    name: ClassVar[str]
    # False for work that serves until it is stopped (an endpoint): its attempt exiting, even with
    # status 0, is a failure, not the work's success.
    ends_by_exiting: ClassVar[bool] = True

    @abstractmethod
    def owns(self, job: Job) -> bool:
        """Whether ``job`` is of this kind, read from the job's row alone (nothing else is loaded)."""

    @abstractmethod
    def attempt_started(self, session: Session, job: Job) -> None:
        """The agent reported the current attempt running."""

    @abstractmethod
    def attempt_ended(
        self, session: Session, job: Job, state: JobState, reason: Reason | None
    ) -> tuple[JobState, Reason | None]:
        """The job is about to end in ``state``; returns the state (and reason) it ends in."""

    @abstractmethod
    def requeued(self, session: Session, job: Job, lost_attempt: int, why: Reason) -> None:
        """``lost_attempt`` was lost and the job queued again for a new one."""

    @abstractmethod
    def artifact_recorded(
        self, session: Session, job: Job, attempt: int, path: str, size: int, sha256: str
    ) -> None:
        """``attempt`` recorded an artifact (a new one, or another attempt's path taken over)."""

    @abstractmethod
    def log_appended(
        self, session: Session, job: Job, attempt: int, log: AttemptLog, fresh_at: int, fresh: bytes
    ) -> None:
        """``fresh``, the bytes the agent sent from offset ``fresh_at``, joined the attempt's log
        (and can be read where the log is stored)."""

    def handed(self, box: SecretBox, job: Job, assignment: Assignment) -> Assignment:
        """The current attempt as its agent receives it, with what only this kind adds (a dev
        environment's per-attempt secret, computed with ``box``); by default as read from the row."""
        return assignment


@dataclass(frozen=True)
class Workload:
    """What a kind gives ``jobs.submit`` beside the job's own fields: everything the job row holds
    for it from the start. ``trainer``: the run spec its agent is handed (``Assignment.trainer``);
    ``inputs``: what each attempt fetches onto its CPod; ``engine``: the engine an endpoint's
    replica serves (``Assignment.engine``)."""

    kind: Kind
    trainer: dict[str, object] | None = None
    engine: dict[str, object] | None = None
    inputs: list[StoredInput] = field(default_factory=list)
    dev_env_id: str | None = None  # the dev environment the job runs (services/devenvs)
    # Cores and memory per node (a dev environment's): placed by, enforced by its runtime, and
    # without GPUs billed per core (docs/billing.md); None: the defaults.
    cpus: int | None = None
    memory_mib: int | None = None


_KINDS: list[Kind] = []


def register(kind: Kind) -> None:
    """Installs ``kind`` (once: a second registration of its name replaces the first)."""
    _KINDS[:] = [k for k in _KINDS if k.name != kind.name] + [kind]


def unregister(kind: Kind) -> None:
    _KINDS[:] = [k for k in _KINDS if k is not kind]


def kind_of(job: Job) -> Kind | None:
    """The kind ``job`` is of, or None for a plain job."""
    return next((kind for kind in _KINDS if kind.owns(job)), None)
