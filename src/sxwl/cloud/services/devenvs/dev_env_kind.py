"""Dev environments as a workload kind (services/jobs/job_kinds.py): their jobs serve until they are
stopped, and each attempt is handed its own JupyterLab token."""

from __future__ import annotations

import base64

from sqlalchemy.orm import Session, object_session

from sxwl.cloud.db.devenv_models import DevEnv, DevEnvState
from sxwl.cloud.db.json_rows import StoredAt, stored_input
from sxwl.cloud.db.models import AttemptLog, Job, JobState
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.kit.security import SecretBox
from sxwl.cloud.services.devenvs import ssh_keys
from sxwl.cloud.services.jobs.job_kinds import Kind
from sxwl.protocol import Assignment
from sxwl.protocol.devenvs import WORKSPACE_ARTIFACT, WORKSPACE_INPUT, DevEnvSpec, base_url
from sxwl.protocol.finetune import JobInput
from sxwl.protocol.reasons import Reason

_TOKEN_PURPOSE = b"sxwl dev-env jupyter token v1"


def jupyter_token(box: SecretBox, job_id: str, attempt: int) -> str:
    """The token of an attempt's JupyterLab: different for every start, unguessable without the
    cloud's key, and computed again by any replica that proxies to it, so it is stored nowhere."""
    mac = box.mac(_TOKEN_PURPOSE, f"{job_id}:{attempt}".encode())
    return base64.urlsafe_b64encode(mac).decode().rstrip("=")


class DevEnvKind(Kind):
    name = "dev-env"
    ends_by_exiting = False  # JupyterLab serves until it is stopped: exiting is a failure

    def owns(self, job: Job) -> bool:
        return job.dev_env_id is not None

    def attempt_started(self, session: Session, job: Job) -> None:
        env = session.get(DevEnv, job.dev_env_id)
        if env is not None:
            env.cpod_id = job.cpod_id

    def attempt_ended(
        self, session: Session, job: Job, state: JobState, reason: Reason | None
    ) -> tuple[JobState, Reason | None]:
        env = session.get(DevEnv, job.dev_env_id)
        # An environment whose job ends on its own has ended; a paused one keeps its state.
        if env is not None and env.job_id == job.id and env.state == DevEnvState.ACTIVE:
            env.state, env.stopped_at = DevEnvState.STOPPED, utcnow()
            env.reason = reason or job.cancel_reason
        return state, reason

    def requeued(self, session: Session, job: Job, lost_attempt: int, why: Reason) -> None:
        """Nothing: the next attempt starts a fresh JupyterLab with a token of its own."""

    def artifact_recorded(
        self, session: Session, job: Job, attempt: int, path: str, size: int, sha256: str
    ) -> None:
        """The workspace an attempt saved as it ended: what a resume on another CPod restores."""
        env = session.get(DevEnv, job.dev_env_id)
        if path != WORKSPACE_ARTIFACT or env is None or env.job_id != job.id:
            return
        entry = JobInput(name=WORKSPACE_INPUT, sha256=sha256, size=size, archive=True)
        env.saved = stored_input(entry, StoredAt(job_id=job.id, attempt=attempt, path=path))

    def log_appended(
        self, session: Session, job: Job, attempt: int, log: AttemptLog, fresh_at: int, fresh: bytes
    ) -> None:
        """Nothing: JupyterLab's log is read as any job's."""

    def handed(self, box: SecretBox, job: Job, assignment: Assignment) -> Assignment:
        assert job.dev_env_id is not None
        env_id, session = job.dev_env_id, object_session(job)
        keys = ssh_keys.authorized_keys(session, job.owner_id) if session is not None else []
        token = jupyter_token(box, job.id, job.attempt)
        spec = DevEnvSpec(base_url=base_url(env_id), workspace=env_id, token=token, ssh_keys=keys)
        return assignment.model_copy(update={"jupyter": spec})


DEV_ENV = DevEnvKind()
