"""A cloud's services on a real database (SQLite or PostgreSQL) with CPods as rows, for scheduling
tests driven through the services themselves: dev environments created, paused and resumed, jobs
submitted, passes run by one replica or another (each with its own capacity cache), and attempts
reported as their agent reports them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import insert, select, update

from sxwl.cloud.config import Settings
from sxwl.cloud.context import CloudContext
from sxwl.cloud.db import migrate
from sxwl.cloud.db.devenv_models import DevEnv
from sxwl.cloud.db.models import CPod, CPodStatus, Job, JobEvent, JobState, Role, User
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services.devenvs import dev_envs
from sxwl.cloud.services.jobs import attempts, jobs
from sxwl.cloud.services.scheduling import scheduler
from sxwl.protocol.devenvs import DevEnvIn
from sxwl.protocol.jobs import JobIn
from sxwl.protocol.reasons import english
from tests.support.cpods import gpu_node

PROVIDER = "p" * 32
USER = "u" * 32


def node(name: str, cores: int, memory_gib: int, gpus: int = 0) -> dict[str, Any]:
    """A ready node as its agent reports it: ``gpus`` A100s, or none."""
    found = gpu_node(name, count=gpus)
    if not gpus:
        del found["gpu"]
    return {**found, "cpu_cores": cores, "memory_mib": memory_gib * 1024}


@dataclass(frozen=True)
class JobSeen:
    state: JobState
    attempt: int
    cpod_id: str | None
    pinned_cpod_id: str | None
    reason: str | None  # in English
    inputs: list[str]  # their names
    events: list[str]  # their kinds, in order


class World:
    """One cloud replica; ``replica()`` opens another on the same database."""

    def __init__(self, settings: Settings, migrated: bool = False) -> None:
        self.settings = settings
        self.ctx = CloudContext.from_settings(settings)
        if migrated:
            return
        migrate.upgrade(self.ctx.db.engine)
        with self.ctx.db.session() as session:
            session.execute(
                insert(User),
                [
                    {"id": PROVIDER, "email": "p@example.com", "password_hash": "x", "role": Role.PROVIDER},
                    {"id": USER, "email": "u@example.com", "password_hash": "x", "role": Role.USER},
                ],
            )

    def replica(self) -> World:
        return World(self.settings, migrated=True)

    def close(self) -> None:
        self.ctx.db.dispose()

    def add_cpod(
        self, cpod_id: str, nodes: list[dict[str, Any]], status: CPodStatus = CPodStatus.ONLINE
    ) -> None:
        with self.ctx.db.session() as session:
            session.execute(
                insert(CPod).values(
                    id=cpod_id,
                    owner_id=PROVIDER,
                    name=cpod_id[:8],
                    cluster_uid=cpod_id,
                    runtime="local",
                    takes_fine_tunes=True,
                    takes_endpoints=True,
                    takes_dev_envs=True,
                    agent_version="t",
                    token_hash=cpod_id,
                    status=status,
                    last_seq=1,
                    last_heartbeat_at=utcnow(),
                    heartbeat_interval_s=30.0,
                    nodes=nodes,
                    reported_jobs=[],
                )
            )

    def set_cpod(self, cpod_id: str, **values: Any) -> None:
        """What a heartbeat or the liveness sweep writes."""
        with self.ctx.db.session() as session:
            session.execute(update(CPod).where(CPod.id == cpod_id).values(**values))

    def schedule(self) -> list[str]:
        """One pass; the ids of the jobs it assigned."""
        return [a.job_id for a in scheduler.schedule_once(self.ctx)]

    def create_env(self, name: str, **fields: Any) -> tuple[str, str]:
        """A dev environment; its id and its job's."""
        with self.ctx.db.session() as session:
            owner = session.get(User, USER)
            assert owner is not None
            env, job = dev_envs.create(self.ctx, session, owner=owner, request=DevEnvIn(name=name, **fields))
            return env.id, job.id

    def submit(self, name: str, **fields: Any) -> str:
        with self.ctx.db.session() as session:
            owner = session.get(User, USER)
            assert owner is not None
            return jobs.submit(self.ctx, session, owner, JobIn(name=name, command=["true"], **fields)).id

    def pause(self, env_id: str) -> None:
        with self.ctx.db.session() as session:
            user = session.get(User, USER)
            assert user is not None
            dev_envs.pause(session, user, env_id, dev_envs.paused_by(user))

    def resume(self, env_id: str) -> str:
        """The new job's id."""
        with self.ctx.db.session() as session:
            user = session.get(User, USER)
            assert user is not None
            return dev_envs.resume(self.ctx, session, user, env_id)[1].id

    def report(self, job_id: str, state: JobState) -> None:
        """What the agent of the job's CPod reports of its current attempt."""
        with self.ctx.db.session() as session:
            job = session.get(Job, job_id)
            assert job is not None and job.cpod_id is not None
            cpod = session.get(CPod, job.cpod_id)
            assert cpod is not None
            attempts.report_status(session, cpod, job_id, job.attempt, state, None, None)

    def save_workspace(self, job_id: str, sha256: str) -> None:
        """The current attempt's workspace uploaded as it ended (what a resume elsewhere restores)."""
        with self.ctx.db.session() as session:
            job = session.get(Job, job_id)
            assert job is not None
            attempts.record_artifact(session, job, job.attempt, "workspace.tar", 1024, sha256)

    def job(self, job_id: str) -> JobSeen:
        with self.ctx.db.session() as session:
            job = session.get(Job, job_id)
            assert job is not None
            events = session.scalars(
                select(JobEvent.kind).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
            )
            return JobSeen(
                job.state,
                job.attempt,
                job.cpod_id,
                job.pinned_cpod_id,
                english(job.reason),
                [i["name"] for i in job.inputs],
                list(events),
            )

    def env(self, env_id: str) -> DevEnv:
        with self.ctx.db.session() as session:
            env = session.get(DevEnv, env_id)
            assert env is not None
            return env
