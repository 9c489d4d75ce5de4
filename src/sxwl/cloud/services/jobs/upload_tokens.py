"""Upload tokens: the one credential of a Kubernetes pod's uploader (``sxwl.agent.pod_uploader``) and
input fetcher (``sxwl.agent.pod_fetcher``). A token lets its holder put artifacts of one job attempt
and read that attempt's inputs, within the window every credential of the attempt has
(attempt_window.py), and nothing else: it is not the CPod token, and the only things it reads are
the job owner's own model, files and checkpoint, which the attempt needs.

The token is an HMAC of the job id and attempt under a key derived from SXWL_SECRET_KEY, not a random
value: an assignment is handed out again until its agent reports it starting (a long-poll's answer can
be lost on the way), and every copy must carry the same token, which a random one stored only as a
hash could not be. So nothing is stored: a token is checked by computing it again, and it is as
secret as the key (docs/agent.md, "Artifacts from pods")."""

from __future__ import annotations

import base64
import hmac

from sqlalchemy.orm import Session

from sxwl.cloud.db.models import Job
from sxwl.cloud.errors import AppError
from sxwl.cloud.kit.security import SecretBox
from sxwl.cloud.services.jobs.attempts import StaleAttempt

UPLOAD_TOKEN_PREFIX = "sxup_"  # noqa: S105 - a prefix, not a secret
PURPOSE = b"sxwl upload token v1"


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


def job_of_token(session: Session, job_id: str, attempt: int) -> Job:
    """The job, locked, if ``attempt`` (the token's) is its current attempt; 404 for no such job, 409
    (``StaleAttempt``) otherwise. The window (attempt_window.py) is the caller's next check."""
    job = session.get(Job, job_id, with_for_update=True)
    if job is None:
        raise AppError(404, f"no job {job_id}")
    if job.attempt != attempt:
        raise StaleAttempt(job, attempt)
    return job
