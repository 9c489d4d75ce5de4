"""Dev environments as their owners see them (docs/dev-envs.md): create one (its models and files
checked before anything is written), list, look, stop; and where the cloud's proxy finds a running
one's JupyterLab. Only the owner ever gets an environment: another user, an administrator included,
is told there is none."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.devenv_models import DevEnv, DevEnvState
from sxwl.cloud.db.finetune_models import DataFile
from sxwl.cloud.db.json_rows import StoredAt, StoredInput, stored_input
from sxwl.cloud.db.models import TERMINAL_STATES, CPod, CPodStatus, Job, JobState, User, new_id
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.errors import AppError
from sxwl.cloud.services.catalog import model_catalog
from sxwl.cloud.services.devenvs.dev_env_kind import DEV_ENV, jupyter_token
from sxwl.cloud.services.finetune.fine_tunes import FILES_JOB
from sxwl.cloud.services.jobs import jobs
from sxwl.cloud.services.jobs.job_kinds import Workload
from sxwl.protocol.devenvs import (
    INPUTS_SEEN_AT,
    DevEnvIn,
    file_input,
    model_input,
    ssh_target,
    tunnel_target,
)
from sxwl.protocol.finetune import JobInput
from sxwl.protocol.jobs import MAX_NAME, JobIn
from sxwl.protocol.reasons import Reason

# What a dev environment's job is asked to run: the agent runs JupyterLab instead (Assignment.jupyter).
DEV_ENV_COMMAND = ["sxwl-dev-env"]


class Status(enum.StrEnum):
    QUEUED = "queued"  # waiting for a CPod with room
    STARTING = "starting"  # placed; JupyterLab is coming up
    RUNNING = "running"  # JupyterLab answers through the tunnel
    PAUSING = "pausing"  # paused; its CPod has not yet said its processes ended
    PAUSED = "paused"  # no processes, no billing; its workspace kept on its CPod
    STOPPING = "stopping"  # stopped by its owner; its CPod has not yet said it ended
    STOPPED = "stopped"
    FAILED = "failed"  # it ended without being stopped (JupyterLab exited, its CPod was lost ...)


def status(env: DevEnv, job: Job | None) -> Status:
    if job is None:
        return Status.STOPPED
    if env.state == DevEnvState.PAUSED:
        return Status.PAUSED if job.state in TERMINAL_STATES else Status.PAUSING
    if env.state == DevEnvState.STOPPED:
        if job.state not in TERMINAL_STATES:
            return Status.STOPPING
        return Status.STOPPED if job.state == JobState.CANCELLED else Status.FAILED
    if job.state in (JobState.QUEUED, JobState.LOST):
        return Status.QUEUED
    return Status.RUNNING if job.state == JobState.RUNNING else Status.STARTING


def _field_error(status_code: int, field: str, message: str) -> AppError:
    return AppError(status_code, f"{field}: {message}", details=[{"field": field, "message": message}])


def _mounts(
    session: Session, owner: User, request: DevEnvIn
) -> tuple[list[dict[str, str]], list[StoredInput]]:
    """Each requested model and file as an input of the environment's jobs, and where it appears."""
    mounts: list[dict[str, str]] = []
    inputs: list[StoredInput] = []

    def add(
        kind: str, name: str, input_name: str, sha256: str, size: int, at: StoredAt, archive: bool
    ) -> None:
        entry = JobInput.model_validate(
            {"name": input_name, "sha256": sha256, "size": size, "archive": archive}
        )
        inputs.append(stored_input(entry, at))
        mounts.append({"kind": kind, "name": name, "path": f"{INPUTS_SEEN_AT}/{input_name}"})

    for index, name in enumerate(request.models):
        model = model_catalog.find(session, owner, name)
        if model is None:
            raise _field_error(404, f"models[{index}]", f"no model {name}; GET /v1/models lists them")
        add("model", name, model_input(index), model.sha256, model.bytes, model.object, True)
    for index, file_id in enumerate(request.files):
        file = session.get(DataFile, file_id)
        if file is None or file.owner_id != owner.id:
            raise _field_error(404, f"files[{index}]", f"no file {file_id}")
        at = StoredAt(job_id=FILES_JOB, attempt=0, path=file.id)
        add("file", file.filename, file_input(index), file.sha256, file.bytes, at, False)
    return mounts, inputs


def _name_taken(name: str) -> AppError:
    return _field_error(409, "name", f"you already have an environment named {name}; stop it or pick another")


def create(ctx: CloudContext, session: Session, *, owner: User, request: DevEnvIn) -> tuple[DevEnv, Job]:
    """Everything is checked before anything is written: a refused request leaves no row behind."""
    live = select(DevEnv.id).where(
        DevEnv.owner_id == owner.id, DevEnv.name == request.name, DevEnv.state != DevEnvState.STOPPED
    )
    if session.scalar(live) is not None:
        raise _name_taken(request.name)
    mounts, inputs = _mounts(session, owner, request)
    env = DevEnv(
        id=new_id(),
        owner_id=owner.id,
        name=request.name,
        state=DevEnvState.ACTIVE,
        gpu_product=request.gpu_product,
        gpus=request.gpus,
        cpus=request.cpus,
        memory_gib=request.memory_gib,
        image=request.image,
        mounts=mounts,
        inputs=inputs,
        idle_timeout_min=request.idle_timeout_min,
    )
    job = _submit(ctx, session, owner, env, cpod_id=None)
    session.add(env)
    try:
        session.flush()
    except IntegrityError:  # another request took the name between the check and this write
        raise _name_taken(request.name) from None
    return env, job


def _submit(
    ctx: CloudContext,
    session: Session,
    owner: User,
    env: DevEnv,
    cpod_id: str | None,
    restored: list[StoredInput] | None = None,
) -> Job:
    """A job that runs the environment: pinned to ``cpod_id``, where its workspace is, or with the
    ``restored`` workspace among its inputs."""
    spec = JobIn(
        name=f"dev-{env.name}"[:MAX_NAME],
        command=DEV_ENV_COMMAND,
        image=env.image,
        gpu_product=env.gpu_product,
        gpus_per_node=env.gpus,
        cpod_id=cpod_id,
    )
    workload = Workload(
        DEV_ENV,
        inputs=[*env.inputs, *(restored or [])],
        dev_env_id=env.id,
        cpus=env.cpus,
        memory_mib=env.memory_gib * 1024 if env.memory_gib else None,
    )
    job = jobs.submit(ctx, session, owner, spec, workload)  # refuses (402) a balance that cannot pay
    env.job_id = job.id
    return job


def get_for(session: Session, user: User, env_id: str) -> tuple[DevEnv, Job | None]:
    """The caller's own environment; anyone else's, an administrator's view included, is not found."""
    env = session.get(DevEnv, env_id) if env_id.isascii() and env_id.isalnum() and len(env_id) <= 32 else None
    if env is None or env.owner_id != user.id:
        raise AppError(404, f"no dev environment {env_id}")
    return env, session.get(Job, env.job_id) if env.job_id else None


def list_for(session: Session, user: User) -> list[tuple[DevEnv, Job | None]]:
    rows = session.execute(
        select(DevEnv, Job)
        .outerjoin(Job, Job.id == DevEnv.job_id)
        .where(DevEnv.owner_id == user.id)
        .order_by(DevEnv.created_at.desc(), DevEnv.id)
    ).all()
    return [(env, job) for env, job in rows]


def stop(session: Session, user: User, env_id: str) -> tuple[DevEnv, Job | None]:
    """Stops its JupyterLab (and with it the billing, once the agent says it ended) and frees its
    name. Stopping a stopped environment is a 409."""
    env, job = get_for(session, user, env_id)
    if env.state == DevEnvState.STOPPED:
        raise AppError(409, "this dev environment is already stopped", code="dev_env_stopped")
    env.state, env.stopped_at = DevEnvState.STOPPED, utcnow()
    env.reason = Reason.of("dev.stopped_by", who=user.email)
    if job is not None and job.state not in TERMINAL_STATES:
        job = jobs.cancel(session, user, job.id)
    return env, job


def _is(env: DevEnv, job: Job | None, code: str) -> AppError:
    """A 409 saying what the environment is, for a request its status does not allow."""
    found = status(env, job).value
    return AppError(409, f"dev environment {env.id} is {found}", code=code, details={"status": found})


def paused_by(user: User) -> Reason:
    return Reason.of("dev.paused_by", who=user.email)


def pause(session: Session, user: User, env_id: str, why: Reason) -> tuple[DevEnv, Job | None]:
    """Stops its processes, and with them the billing; its workspace stays on its CPod."""
    env, job = get_for(session, user, env_id)
    if env.state != DevEnvState.ACTIVE or job is None or job.state in TERMINAL_STATES:
        raise _is(env, job, "dev_env_not_running")
    env.state, env.reason = DevEnvState.PAUSED, why
    return env, jobs.cancel(session, user, job.id)


def resume(ctx: CloudContext, session: Session, user: User, env_id: str) -> tuple[DevEnv, Job]:
    """Runs it again on the CPod that keeps its workspace; where that CPod is gone (revoked or
    offline), anywhere else with the workspace its last attempt saved to the artifact store. While
    its CPod has no room and another has, the scheduler moves it there the same way, if that copy is
    the latest (services/devenvs/relocation.py)."""
    env, job = get_for(session, user, env_id)
    if env.state != DevEnvState.PAUSED or (job is not None and job.state not in TERMINAL_STATES):
        raise _is(env, job, "dev_env_not_paused")
    cpod = session.get(CPod, env.cpod_id) if env.cpod_id else None
    gone = env.cpod_id is not None and (
        cpod is None or cpod.revoked_at is not None or cpod.status == CPodStatus.OFFLINE
    )
    if gone and env.saved is None:
        message = "the CPod that keeps its workspace is gone, and no saved copy of it is stored"
        raise AppError(409, message, code="dev_env_workspace_lost")
    restored = [env.saved] if gone and env.saved is not None else []
    job = _submit(ctx, session, user, env, cpod_id=None if gone else env.cpod_id, restored=restored)
    env.state, env.reason = DevEnvState.ACTIVE, None
    return env, job


@dataclass(frozen=True)
class Upstream:
    """Where a running environment's JupyterLab is reached, and the token it takes."""

    cpod_id: str
    target: str
    token: str


def upstream(ctx: CloudContext, session: Session, user: User, env_id: str) -> Upstream:
    """The JupyterLab of the caller's running environment (404 for anyone else's; 409 while it is not
    running, with its status)."""
    env, job = get_for(session, user, env_id)
    found = status(env, job)
    if job is None or found != Status.RUNNING or job.cpod_id is None:
        raise _is(env, job, "dev_env_not_running")
    return upstream_at(ctx, job.cpod_id, job.id, job.attempt)


def ssh_upstream(ctx: CloudContext, session: Session, user: User, env_id: str) -> Upstream:
    """The sshd of the caller's running environment (its token unused: sshd takes the user's keys)."""
    found = upstream(ctx, session, user, env_id)
    job_id, attempt = found.target.split(".")[1], int(found.target.split(".")[2])
    return Upstream(found.cpod_id, ssh_target(job_id, attempt), "")


def upstream_at(ctx: CloudContext, cpod_id: str, job_id: str, attempt: int) -> Upstream:
    """The JupyterLab of ``attempt`` of ``job_id``, on ``cpod_id``."""
    return Upstream(cpod_id, tunnel_target(job_id, attempt), jupyter_token(ctx.box, job_id, attempt))
