"""The upload window: how long an attempt may still write artifacts and read its inputs, whichever
credential asks (the CPod token of the CPod that runs it, or the attempt's upload token of a
Kubernetes pod, upload_tokens.py). One rule for every credential, so that none outlives the
attempt (docs/agent.md, "When an attempt's credentials stop working"):

- artifacts while the attempt is current and not lost, and up to ``UPLOAD_AFTER_END_S`` after it
  ended: the final uploads of ranks the Job controller stops after a failure finish in that grace
  (the local agent and the pods' uploaders send the rest before the end is reported);
- inputs only until it ends: they are fetched before the attempt's command starts.

What an attempt recorded is never replaced, in the window or after it (attempts.record_artifact and
the store's write-once puts): the window bounds new paths only."""

from __future__ import annotations

from sqlalchemy.orm import Session

from sxwl.cloud.db.models import Job, JobAttempt, JobState
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.errors import AppError
from sxwl.cloud.services.jobs.attempts import StaleAttempt

# Long enough for a pod's uploader to finish after the agent reported the attempt's end (the uploader
# runs before that report, so this covers only the ranks the Job controller stops after a failure).
# A presigned upload URL expires within it too (api/agent/artifact_uploads.py): no write lands later.
UPLOAD_AFTER_END_S = 15 * 60


def upload_seconds_left(session: Session, job: Job, attempt: int) -> int:
    """How long ``attempt`` of ``job`` (the job's current attempt, as the credential's check found)
    may still upload: the whole grace while it runs, what is left of it once it ended. A lost attempt
    is stale (409 ``stale_attempt``); one that ended more than the grace ago is 409 ``upload_closed``."""
    placed = _placed(session, job, attempt)
    if placed.finished_at is None:
        return UPLOAD_AFTER_END_S
    left = UPLOAD_AFTER_END_S - (utcnow() - placed.finished_at).total_seconds()
    if left <= 0:
        raise AppError(
            409,
            f"attempt {attempt} of job {job.id} ended more than {UPLOAD_AFTER_END_S} s ago; "
            "it takes no more artifacts",
            code="upload_closed",
            details={"ended_at": placed.finished_at.isoformat()},
        )
    return max(1, int(left))


def check_inputs_open(session: Session, job: Job, attempt: int) -> None:
    """Raises unless ``attempt`` may read its inputs: it has not ended (409 ``inputs_closed``) and is
    not lost (409 ``stale_attempt``)."""
    placed = _placed(session, job, attempt)
    if placed.finished_at is not None:
        raise AppError(
            409,
            f"attempt {attempt} of job {job.id} has ended; it fetches no more inputs",
            code="inputs_closed",
            details={"ended_at": placed.finished_at.isoformat()},
        )


def _placed(session: Session, job: Job, attempt: int) -> JobAttempt:
    # A job lost for the last time keeps its CPod and attempt number (attempts.requeue), so the
    # CPod token's own check passes: the attempt's outcome is what fences it.
    placed = session.get(JobAttempt, (job.id, attempt))
    if placed is None or placed.outcome == JobState.LOST.value:
        raise StaleAttempt(job, attempt)
    return placed
