"""Upload tokens: the one credential of a Kubernetes pod's uploader (``sxwl.agent.pod_uploader``) and
input fetcher (``sxwl.agent.pod_fetcher``). A token lets its holder put artifacts of one job attempt,
while that attempt is current or ended at most ``UPLOAD_AFTER_END_S`` ago, and read that attempt's
inputs while it is current and has not ended, and nothing else: it is not the CPod token, and the
only things it reads are the job owner's own model, files and checkpoint, which the attempt needs.

The token is an HMAC of the job id and attempt under a key derived from SXWL_SECRET_KEY, not a random
value: an assignment is handed out again until its agent reports it starting (a long-poll's answer can
be lost on the way), and every copy must carry the same token, which a random one stored only as a
hash could not be. So nothing is stored: a token is checked by computing it again, and it is as
secret as the key (docs/agent.md, "Artifacts from pods")."""

from __future__ import annotations

import base64
import hmac
from datetime import timedelta

from sqlalchemy.orm import Session

from sxwl.cloud.db.models import Job, JobAttempt, JobState
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.errors import AppError
from sxwl.cloud.security import SecretBox
from sxwl.cloud.services.attempts import StaleAttempt

UPLOAD_TOKEN_PREFIX = "sxup_"  # noqa: S105 - a prefix, not a secret
PURPOSE = b"sxwl upload token v1"
# Long enough for a pod's uploader to finish after the agent reported the attempt's end (the uploader
# runs before that report, so this covers only the ranks the Job controller stops after a failure).
UPLOAD_AFTER_END_S = 15 * 60


def token_for(box: SecretBox, job_id: str, attempt: int) -> str:
    digest = box.mac(PURPOSE, f"{job_id}\n{attempt}".encode())
    return UPLOAD_TOKEN_PREFIX + base64.urlsafe_b64encode(digest).decode().rstrip("=")


def check_token(box: SecretBox, token: str | None, job_id: str, attempt: int) -> None:
    """401 without a token, 403 for a token of another attempt (or none of this cloud's)."""
    if not token:
        raise AppError(
            401, "an upload token is required as the bearer token", headers={"WWW-Authenticate": "Bearer"}
        )
    if not hmac.compare_digest(token.encode(), token_for(box, job_id, attempt).encode()):
        raise AppError(
            403, f"this upload token is not for attempt {attempt} of job {job_id}", code="not_your_upload"
        )


def job_for_upload(session: Session, job_id: str, attempt: int) -> Job:
    """The job, locked, if ``attempt`` may still upload: it is the job's current attempt, not lost, and
    open or ended at most ``UPLOAD_AFTER_END_S`` ago; otherwise 404 or 409."""
    job, placed = _current(session, job_id, attempt)
    if placed.finished_at is not None and utcnow() - placed.finished_at > timedelta(
        seconds=UPLOAD_AFTER_END_S
    ):
        raise AppError(
            409,
            f"attempt {attempt} of job {job_id} ended more than {UPLOAD_AFTER_END_S} s ago; "
            "it takes no more artifacts",
            code="upload_closed",
        )
    return job


def job_for_inputs(session: Session, job_id: str, attempt: int) -> Job:
    """The job, locked, if ``attempt`` may read its inputs: it is the job's current attempt, not lost,
    and has not ended (inputs are fetched before the attempt's command starts); otherwise 404 or 409."""
    job, placed = _current(session, job_id, attempt)
    if placed.finished_at is not None:
        raise AppError(
            409,
            f"attempt {attempt} of job {job_id} has ended; it fetches no more inputs",
            code="inputs_closed",
        )
    return job


def _current(session: Session, job_id: str, attempt: int) -> tuple[Job, JobAttempt]:
    """The job, locked, and ``attempt``'s row if it is the job's current attempt and not lost; 404 for
    no such job, 409 (``StaleAttempt``) otherwise."""
    job = session.get(Job, job_id, with_for_update=True)
    if job is None:
        raise AppError(404, f"no job {job_id}")
    placed = session.get(JobAttempt, (job_id, attempt))
    if job.attempt != attempt or placed is None or placed.outcome == JobState.LOST.value:
        raise StaleAttempt(job, attempt)
    return job, placed
