"""Fine-tunes as a workload kind (services/jobs/job_kinds.py): what their jobs' attempts add to the job
system, each in the transaction of the report, upload or log append that caused it."""

from __future__ import annotations

from sqlalchemy.orm import Session

from sxwl.cloud.db.models import AttemptLog, Job, JobState
from sxwl.cloud.services.finetune import fine_tune_outputs, fine_tune_progress
from sxwl.cloud.services.jobs.job_kinds import Kind
from sxwl.protocol.reasons import Reason


class FineTuneKind(Kind):
    name = "fine-tune"

    def owns(self, job: Job) -> bool:
        return job.trainer is not None  # a fine-tune's job is the one that runs the trainer

    def attempt_started(self, session: Session, job: Job) -> None:
        """Nothing: the trainer says when it starts training, in its progress lines."""

    def attempt_ended(
        self, session: Session, job: Job, state: JobState, reason: Reason | None
    ) -> tuple[JobState, Reason | None]:
        return fine_tune_outputs.at_end(job, session, state, reason)  # its adapter decides success

    def requeued(self, session: Session, job: Job, lost_attempt: int, why: Reason) -> None:
        fine_tune_outputs.requeued(session, job, lost_attempt, why)

    def artifact_recorded(
        self, session: Session, job: Job, attempt: int, path: str, size: int, sha256: str
    ) -> None:
        fine_tune_outputs.artifact_recorded(session, job, attempt, path, size, sha256)

    def log_appended(
        self, session: Session, job: Job, attempt: int, log: AttemptLog, fresh_at: int, fresh: bytes
    ) -> None:
        fine_tune_progress.absorb(session, job, attempt, log, fresh_at, fresh)


FINE_TUNE = FineTuneKind()
