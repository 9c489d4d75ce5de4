"""A stopped dev environment leaves nothing behind (docs/dev-envs.md, "Pause, resume, stop"): once
its last job has ended, its CPod is told to remove its workspace folder (one ``forget_workspace``
command) and the workspace tars its attempts saved are deleted from the artifact store, with their
rows. A sweep, not a step of ``stop``: the last attempt's tar may be recorded after its end is, and
an environment stopped while running ends only when its agent says so. Every replica may sweep: the
command is added by a conditional update, and deleting an object twice is no error."""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.devenv_models import DevEnv, DevEnvState
from sxwl.cloud.db.models import (
    FORGET_WORKSPACE,
    TERMINAL_STATES,
    AgentCommand,
    Artifact,
    CPod,
    Job,
    JobAttempt,
)
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.kit.notify import on_commit
from sxwl.cloud.storage import Artifact as Stored
from sxwl.cloud.storage import StoreUnavailable
from sxwl.protocol.devenvs import WORKSPACE_ARTIFACT

log = logging.getLogger("sxwl.dev_envs")
BATCH = 500  # environments or tars per sweep: the next sweep takes the rest


def forget_stopped(session: Session) -> list[str]:
    """Tells every CPod that ran a stopped environment whose last job has ended (a resumed one ran
    on several) to remove its workspace, once; the environments' ids. A revoked CPod's agent can no
    longer be told anything."""
    found = session.execute(
        select(DevEnv.id, DevEnv.job_id, Job.attempt)
        .join(Job, Job.id == DevEnv.job_id)
        .where(
            DevEnv.state == DevEnvState.STOPPED,
            DevEnv.workspace_forgotten_at.is_(None),
            Job.state.in_(TERMINAL_STATES),
        )
        .limit(BATCH)
    ).all()
    told = []
    for env_id, job_id, attempt in found:
        won = session.execute(
            update(DevEnv)
            .where(DevEnv.id == env_id, DevEnv.workspace_forgotten_at.is_(None))
            .values(workspace_forgotten_at=utcnow())
        )
        if not won.rowcount:  # type: ignore[attr-defined]  # another replica's sweep took it
            continue
        ran_on = session.scalars(
            select(CPod.id)
            .join(JobAttempt, JobAttempt.cpod_id == CPod.id)
            .join(Job, Job.id == JobAttempt.job_id)
            .where(Job.dev_env_id == env_id, CPod.revoked_at.is_(None))
            .distinct()
        ).all()
        for cpod_id in ran_on:
            command = AgentCommand(
                cpod_id=cpod_id,
                kind=FORGET_WORKSPACE,
                job_id=job_id,
                attempt=attempt,
                reason="dev environment stopped",
                workspace=env_id,
            )
            session.add(command)
            on_commit(session).wake_cpod(cpod_id)
        told.append(env_id)
    return told


def stopped_tars(session: Session) -> list[Stored]:
    """The saved workspaces of stopped environments' ended jobs that the store still holds."""
    rows = session.execute(
        select(Artifact.job_id, Artifact.attempt, Artifact.path)
        .join(Job, Job.id == Artifact.job_id)
        .join(DevEnv, DevEnv.id == Job.dev_env_id)
        .where(
            Artifact.path == WORKSPACE_ARTIFACT,
            DevEnv.state == DevEnvState.STOPPED,
            Job.state.in_(TERMINAL_STATES),
        )
        .limit(BATCH)
    ).all()
    return [Stored(job_id, attempt, path) for job_id, attempt, path in rows]


def forget_tar(session: Session, tar: Stored) -> None:
    """The row of a deleted tar, and the environment's record of it as its saved workspace."""
    session.execute(delete(Artifact).where(Artifact.job_id == tar.job_id, Artifact.path == tar.path))
    env_id = session.scalar(select(Job.dev_env_id).where(Job.id == tar.job_id))
    env = session.get(DevEnv, env_id) if env_id else None
    if env is not None and env.saved is not None and env.saved["object"]["job_id"] == tar.job_id:
        env.saved = None


async def sweep(ctx: CloudContext) -> tuple[int, int]:
    """One sweep: (workspaces whose CPods were told, tars deleted). Bytes go before their row, so a
    store that fails leaves a row to try again, never bytes no row points to."""

    def find() -> tuple[list[str], list[Stored]]:
        with ctx.db.session() as session:
            return forget_stopped(session), stopped_tars(session)

    def forget(tar: Stored) -> None:
        with ctx.db.session() as session:
            forget_tar(session, tar)

    told, tars = await asyncio.to_thread(find)
    deleted = 0
    for tar in tars:
        try:
            await ctx.artifacts.delete(tar)
        except StoreUnavailable as exc:
            log.warning("saved workspace %s/%s not deleted yet: %s", tar.job_id, tar.path, exc)
            continue
        await asyncio.to_thread(forget, tar)
        deleted += 1
    return len(told), deleted
