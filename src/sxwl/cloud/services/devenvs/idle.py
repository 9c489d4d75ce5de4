"""Idle culling (docs/dev-envs.md): a running environment nobody uses is paused after its
``idle_timeout_min``, with the reason ``dev.idle`` its owner sees. In use means, at a check,
JupyterLab has a kernel connection open or its own last-activity mark moved since the last check
(an open JupyterLab tab polls its API, a kernel computing or a terminal printing moves it too); the
time counts on the cloud's clock from the last check that saw it in use, never from JupyterLab's."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import select

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.devenv_models import DevEnv, DevEnvState
from sxwl.cloud.db.models import Job, JobState, User
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services.devenvs import dev_envs
from sxwl.protocol.reasons import Reason


@dataclass(frozen=True)
class Running:
    env_id: str
    job_id: str
    upstream: dev_envs.Upstream


@dataclass(frozen=True)
class Seen:
    """What JupyterLab said at a check: its open kernel connections and its last-activity mark."""

    env_id: str
    job_id: str
    connections: int
    last_activity: str


def running(ctx: CloudContext) -> list[Running]:
    with ctx.db.session() as session:
        rows = session.execute(
            select(DevEnv.id, Job.id, Job.attempt, Job.cpod_id)
            .join(Job, Job.id == DevEnv.job_id)
            .where(DevEnv.state == DevEnvState.ACTIVE, Job.state == JobState.RUNNING)
        ).all()
    return [
        Running(
            env_id,
            job_id,
            dev_envs.upstream_at(ctx, cpod, job_id, attempt),
        )
        for env_id, job_id, attempt, cpod in rows
        if cpod is not None
    ]


def judge(ctx: CloudContext, seen: list[Seen]) -> list[str]:
    """Marks the environments seen in use, pauses those idle past their timeout; the ids paused."""
    paused = []
    now = utcnow()
    with ctx.db.session() as session:
        for one in seen:
            env = session.get(DevEnv, one.env_id)
            job = session.get(Job, one.job_id)
            if env is None or job is None or env.job_id != job.id or env.state != DevEnvState.ACTIVE:
                continue
            if one.connections > 0 or one.last_activity != env.jupyter_activity or env.active_at is None:
                env.active_at, env.jupyter_activity = now, one.last_activity
                continue
            if job.state == JobState.RUNNING and now - env.active_at >= timedelta(
                minutes=env.idle_timeout_min
            ):
                why = Reason.of("dev.idle", minutes=env.idle_timeout_min)
                owner = session.get(User, env.owner_id)
                assert owner is not None
                dev_envs.pause(session, owner, env.id, why)
                paused.append(env.id)
    return paused
