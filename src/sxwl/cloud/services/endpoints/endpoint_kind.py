"""Endpoints as a workload kind (services/jobs/job_kinds.py): a replica's job serves until it is
stopped, so an attempt that exits is a failure (``ends_by_exiting``); the agent reports it running
only once its engine answers, so the first time every replica runs the endpoint is ready."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sxwl.cloud.db.endpoint_models import Endpoint, EndpointReplica
from sxwl.cloud.db.models import AttemptLog, Job, JobState
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services.endpoints import replacement
from sxwl.cloud.services.jobs.job_kinds import Kind
from sxwl.protocol.reasons import Reason


class EndpointKind(Kind):
    name = "endpoint"
    ends_by_exiting = False

    def owns(self, job: Job) -> bool:
        return job.engine is not None  # a replica's job is the one that runs an engine

    def attempt_started(self, session: Session, job: Job) -> None:
        """Marks the endpoint ready the first time all its replicas serve at once."""
        endpoint = session.scalar(
            select(Endpoint)
            .join(EndpointReplica, EndpointReplica.endpoint_id == Endpoint.id)
            .where(EndpointReplica.job_id == job.id)
        )
        if endpoint is None or endpoint.ready_at is not None:
            return
        running = session.scalar(
            select(func.count())
            .select_from(EndpointReplica)
            .join(Job, Job.id == EndpointReplica.job_id)
            .where(
                EndpointReplica.endpoint_id == endpoint.id, Job.state == JobState.RUNNING, Job.id != job.id
            )
        )
        if (running or 0) + 1 >= endpoint.replicas:
            endpoint.ready_at = utcnow()

    def attempt_ended(
        self, session: Session, job: Job, state: JobState, reason: Reason | None
    ) -> tuple[JobState, Reason | None]:
        """A replica that served and failed is replaced (replacement.py); the agent's reason, the
        engine's last lines when it gave up, stays the failed job's."""
        if state == JobState.FAILED:
            reason = replacement.replace(session, job, reason)
        return state, reason

    def requeued(self, session: Session, job: Job, lost_attempt: int, why: Reason) -> None:
        """Nothing: the endpoint shows degraded until the new attempt serves (a lost CPod's replica is
        requeued as every job is; only a failed one is replaced)."""

    def artifact_recorded(
        self, session: Session, job: Job, attempt: int, path: str, size: int, sha256: str
    ) -> None:
        """Nothing: a replica writes no artifacts the endpoint keeps."""

    def log_appended(
        self, session: Session, job: Job, attempt: int, log: AttemptLog, fresh_at: int, fresh: bytes
    ) -> None:
        """Nothing: the engine's log is the job's, read as it is."""


ENDPOINT = EndpointKind()
